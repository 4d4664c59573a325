"""Log storms: what a hostile client can make the server log, bounded and scrubbed.

aiohttp logs every malformed request as ``Error handling request`` with a traceback and the
offending bytes echoed (an ``Authorization`` line included), and asyncio logs a traceback on every
failed ``accept()`` (e.g. out of file descriptors) — thousands of lines a second from one client,
and secrets in the log. Neither library has a setting for it, so :class:`StormFilter` sits on their
loggers: one line per cause per interval, saying how many more like it came since the last one,
with no traceback and no request bytes (the cause is the error's name and its first words, e.g.
``BadHttpMessage: Invalid header value char``)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

INTERVAL_S = 60.0
_MAX_CAUSE_CHARS = 80


def _bad_request(record: logging.LogRecord) -> bool:
    """aiohttp's record of a request that did not parse (the client's doing; an error raised by a
    handler keeps its traceback)."""
    from aiohttp.http_exceptions import HttpProcessingError

    return record.exc_info is not None and isinstance(record.exc_info[1], HttpProcessingError)


def _failed_accept(record: logging.LogRecord) -> bool:
    """asyncio's record of an ``accept()`` that failed (out of descriptors: every retry logs)."""
    return str(record.msg).startswith("socket.accept() out of system resource")


# the loggers a client can make talk, and which of their records are its doing
STORMS: dict[str, Callable[[logging.LogRecord], bool]] = {
    "aiohttp.server": _bad_request, "asyncio": _failed_accept,
    "lyre.connections": lambda record: True,  # connections refused at accept or cut for slowness: all a client's doing
}


class StormFilter(logging.Filter):
    """Lets the first record of each cause through per ``interval_s`` (rewritten: its cause and how
    many like it were held back since the last line, no traceback); drops the rest. Records below
    WARNING, and those ``match`` says are not a client's doing, pass unchanged."""

    def __init__(self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                 match: Callable[[logging.LogRecord], bool] = lambda record: True) -> None:
        super().__init__()
        self.interval_s, self.clock, self.match = interval_s, clock, match
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # cause -> when its last line went out
        self._held: dict[str, int] = {}  # cause -> records dropped since

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not self.match(record):
            return True
        cause = _cause(record)
        now = self.clock()
        with self._lock:
            last = self._last.get(cause)
            if last is not None and now - last < self.interval_s:
                self._held[cause] = self._held.get(cause, 0) + 1
                return False
            held = self._held.pop(cause, 0)
            self._last[cause] = now
        more = f" ({held} more like it in the last {now - last:.0f} s)" if held and last is not None else ""
        record.msg, record.args = "%s%s (at most one line per %.0f s for this cause)", (cause, more, self.interval_s)
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def _cause(record: logging.LogRecord) -> str:
    """What went wrong, without what the client sent: the message's first words, and the error's
    type and the first words of its message (aiohttp's quote the request's bytes after a colon)."""
    head = str(record.msg).split("%", 1)[0].split(" from ", 1)[0].strip().rstrip(":").strip()  # (no address either)
    error = record.exc_info[1] if record.exc_info else None
    if error is not None:
        text = getattr(error, "message", None) or (error.args[0] if error.args else "")
        first = re.split(r"[:\n]", str(text), maxsplit=1)[0].strip()
        head = f"{head}: {type(error).__name__}" + (f": {first}" if first else "")
    return head[:_MAX_CAUSE_CHARS]


_installed = threading.Lock()


def install(interval_s: float = INTERVAL_S) -> None:
    """Put a :class:`StormFilter` on each logger of :data:`STORMS` (once per process)."""
    with _installed:
        for name, match in STORMS.items():
            logger = logging.getLogger(name)
            if not any(isinstance(f, StormFilter) for f in logger.filters):
                logger.addFilter(StormFilter(interval_s, match=match))
