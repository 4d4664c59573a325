"""Whether some thread or process waits for an flock(2) lock, read from ``/proc/locks`` (a waiter's
line there is marked ``->``): a test holds a lock and sees the other side block on it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO


def someone_waits_on(lock: IO) -> bool:
    """Whether a process (or another open file of this one) is blocked on ``lock``'s file."""
    inode = os.fstat(lock.fileno()).st_ino
    return any(line.split()[1] == "->" and line.split()[6].endswith(f":{inode}")
               for line in Path("/proc/locks").read_text().splitlines() if "->" in line)
