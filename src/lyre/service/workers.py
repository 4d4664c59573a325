"""The bounded pool that decodes and encodes uploaded audio (enrollment, verification).

``voices.workers`` threads, each at a lower CPU priority than the rest of the process (a Linux
thread has its own nice value), so that a flood of uploads slows uploads, not the engine thread's
steps; at most ``voices.max_in_flight`` jobs of all accounts wait or run at once, more are refused
at once (429). A job takes its place once its upload has been read: an upload that stalls holds
its connection (until the body timeout cuts it) and its account's quota, never a place here.
(Torch's own intra-op threads, which a SNAC encode uses, are shared with the engine and keep their
priority; ``voices.workers`` bounds how many encodes ask for them at once.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from lyre.errors import OverloadedError

log = logging.getLogger("lyre.voices")

NICENESS = 10  # added to the workers' nice value: the engine thread comes first
T = TypeVar("T")


def _lower_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICENESS)  # this thread only (Linux)
    except (AttributeError, OSError) as e:  # not Linux, or not allowed: the bound still holds
        log.debug("audio worker keeps the process's priority: %s", e)


class AudioWorkers:
    def __init__(self, workers: int, max_in_flight: int):
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="lyre-audio", initializer=_lower_priority)

    @contextlib.contextmanager
    def place(self) -> Iterator[None]:
        """One job's place (on the event loop); OverloadedError when all are taken."""
        if self.in_flight >= self.max_in_flight:
            raise OverloadedError(1.0, f"{self.in_flight} audio uploads are being decoded or encoded "
                                       f"(voices.max_in_flight)")
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread. A caller cancelled meanwhile waits for a job that has
        started to end before it unwinds, so the place it holds is freed only when the work is (a
        client that cancels and retries cannot pile jobs up behind the bound)."""
        work = self._pool.submit(fn, *args)
        job = asyncio.wrap_future(work)
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            if not work.cancel():  # (a job not started yet is dropped; a running one is waited for)
                with contextlib.suppress(BaseException):
                    await job
            raise

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
