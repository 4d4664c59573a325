"""CPU seconds this process spends on each part of speaking (``benchmark.py``'s cost table).

Each part is timed where it runs, with its thread's CPU clock (``time.thread_time``), so parts that
run at once on several threads (the engine step beside the codec's calls) are each counted whole
and nothing is counted for a thread that waits. ``/v1/stats`` (operator view) reports the totals
with the process's CPU time, the rest being everything else: the event loop, protocols, scheduling,
Python's own work, and helper threads a library starts for itself (torch's intra-op threads when
``model.cpu_threads`` > 1; the llama.cpp peer charges its decode threads to ``model`` itself).

- ``model``: the decoder's forward passes (prefill and decode)
- ``sampling``: logits over the vocabulary or a frame slot, penalty, the draw
- ``codec``: SNAC decode calls
- ``encoding``: audio formats (PCM to mp3/opus/..., time-stretch, resampling)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

PARTS = ("model", "sampling", "codec", "encoding")


class CpuLedger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spent = dict.fromkeys(PARTS, 0.0)

    @contextmanager
    def measure(self, part: str) -> Iterator[None]:
        """Charge ``part`` with the CPU time this thread spends inside the block."""
        t0 = time.thread_time()
        try:
            yield
        finally:
            self.add(part, time.thread_time() - t0)

    def add(self, part: str, seconds: float) -> None:
        """Charge ``part`` with CPU time measured otherwise (another library's own threads)."""
        with self._lock:
            self._spent[part] += seconds

    def snapshot(self) -> dict[str, float]:
        """Seconds per part so far, and ``process``: the whole process's CPU time."""
        with self._lock:
            spent = dict(self._spent)
        return {**{k: round(v, 4) for k, v in spent.items()}, "process": round(time.process_time(), 4)}


LEDGER = CpuLedger()  # one per process, as the CPU clock it reads
