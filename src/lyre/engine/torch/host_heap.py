"""Keep freed host memory for reuse: glibc's malloc serves an allocation of more than its mmap
threshold (128 KiB at first, rising to at most 32 MiB as such blocks are freed) with fresh pages
from the kernel and gives them back on free. A CPU step allocates several (batch, vocabulary)
float tensors (32 x 157k x 4 bytes = 20 MB each) and frees them again: every step page-faulted
them all in anew. Served from the heap and kept there, the full-vocabulary sampling of 32 rows
takes 17 ms instead of 31 ms on the small shape, and the engine steps 1.15-1.25x faster at 16-32
sequences (``benchmark.py --mode engine``, whole vocabulary).

Process-wide, for the CPU engine only (``model.keep_freed_memory``, off by default: in the server on
the tiny demo, one run with it held fewer single streams real time — 3/8 and 5/8 against 8/9
without); a no-op off glibc. The heap then keeps up to ``TRIM_BYTES`` of freed memory at its top
instead of returning it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
MMAP_BYTES = 32 * 1024 * 1024  # glibc's upper limit for the threshold on 64-bit
TRIM_BYTES = 256 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False where that is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_BYTES))
    if not ok:
        log.debug("mallopt refused the thresholds: freed host memory is returned to the kernel as before")
    return ok
