"""The access log (logger ``lyre.access``): one line per REST request (an SSE stream's when it
ends), per WebSocket context and refused WebSocket message, per WebSocket when it closes, and per
gRPC and Riva call.

A line says when, which protocol, the client's address (behind a trusted balancer: the forwarded
one), the account (never its key), the route or RPC (the route's pattern, never the raw path,
which a client may fill with anything), the status (HTTP status, or gRPC code name), the error code
when refused, bytes sent, audio seconds, duration and the request id (the one in ``X-Request-Id``).
``server.access_log``: ``text`` (default: ``key=value`` fields), ``json`` (one JSON object a line,
written bare to stderr, for log shippers) or ``off``.

A client controls how many lines it causes, so refusals (status >= 400, any gRPC code but OK) are
held to ``BURST`` lines per cause (protocol, route, status, code, client) per ``INTERVAL_S``; the
next line of a cause after that says how many like it were held back. Nothing a client sends is
written but the request id, and only when it is not one of the server's API keys.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

log = logging.getLogger("lyre.access")

INTERVAL_S = 60.0
BURST = 10  # refused lines of one cause per interval
MAX_CAUSES = 4096  # causes tracked at once (a flood from many addresses shares one past it)


REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # a client's X-Request-Id kept as it is


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def request_id(sent: str | None, authorization: str | None, is_key: Callable[[str], bool]) -> str:
    """The client's request id when it is sane and no credential (an API key of the server's, or the
    token this very request authenticates with, right or wrong), else a new one."""
    sent = str(sent or "")
    token = str(authorization or "").partition(" ")[2].strip()
    if (not REQUEST_ID.fullmatch(sent) or is_key(sent) or sent in str(authorization or "")
            or (len(token) >= 8 and token in sent)):
        return new_request_id()
    return sent


CURRENT: contextvars.ContextVar[Entry | None] = contextvars.ContextVar("lyre_access_entry", default=None)
METHOD: contextvars.ContextVar[str] = contextvars.ContextVar("lyre_grpc_method", default="-")  # a gRPC call's


def add_audio(seconds: float, nbytes: int = 0) -> None:
    """Count audio (and the bytes it was sent as) to the request this task serves, if any."""
    entry = CURRENT.get()
    if entry is not None:
        entry.audio_s += seconds
        entry.bytes += nbytes


@dataclass
class Entry:
    """One line of the access log, filled in as its request goes."""

    protocol: str  # rest, ws, grpc, riva
    route: str  # "POST /v1/audio/speech", "ws context", "lyre.v1.TextToSpeech/Synthesize"
    client: str | None
    request_id: str
    started: float = field(default_factory=time.monotonic)
    account: str | None = None
    status: int | str = "-"
    code: str | None = None  # the error's code, when refused
    bytes: int = 0
    audio_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. a WebSocket context's id and messages

    @property
    def refused(self) -> bool:
        return self.status != "OK" and (not isinstance(self.status, int) or self.status >= 400)

    def fields(self) -> dict[str, Any]:
        return {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "protocol": self.protocol, "client": self.client or "-", "account": self.account or "-",
                "route": self.route, "status": self.status, "code": self.code or "-", "bytes": self.bytes,
                "audio_s": round(self.audio_s, 3), "ms": round(1000 * (time.monotonic() - self.started), 1),
                "request_id": self.request_id, **self.extra}


class AccessLog:
    def __init__(self, fmt: str = "text", interval_s: float = INTERVAL_S, burst: int = BURST,
                 clock: Callable[[], float] = time.monotonic):
        self.fmt, self.interval_s, self.burst, self.clock = fmt, interval_s, burst, clock
        self._lock = threading.Lock()
        self._window = clock()
        self._counts: dict[tuple, int] = {}  # cause -> refused lines in this window
        self._held: dict[tuple, int] = {}  # cause -> lines held back (said by its next line out)
        if fmt == "json":
            _bare_handler()

    @property
    def enabled(self) -> bool:
        return self.fmt != "off"

    def write(self, entry: Entry) -> None:
        if not self.enabled:
            return
        line = entry.fields()
        if entry.refused:
            held = self._admit((entry.protocol, entry.route, entry.status, entry.code, entry.client))
            if held is None:
                return
            if held:
                line["held_back"] = held  # lines like it not written since the last one
        if self.fmt == "json":
            log.info("%s", json.dumps(line, separators=(",", ":"), default=str))
        else:
            log.info("%s", " ".join(f"{k}={_text(v)}" for k, v in line.items()))

    def _admit(self, cause: tuple) -> int | None:
        """None: hold this line back; else how many lines of its cause were held back before it."""
        with self._lock:
            now = self.clock()
            if now - self._window >= self.interval_s:
                self._window, self._counts = now, {}  # (held counts carry over to each cause's next line,
                if len(self._held) > MAX_CAUSES:  # unless a flood from many addresses left too many)
                    self._held = {}
            if cause not in self._counts and len(self._counts) >= MAX_CAUSES:
                cause = ("(many causes)",)
            n = self._counts.get(cause, 0)
            if n >= self.burst:
                self._held[cause] = self._held.get(cause, 0) + 1
                return None
            self._counts[cause] = n + 1
            return self._held.pop(cause, 0)


def _text(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (not text or any(c in text for c in ' "=\\') or not text.isprintable()) else text


_bare = threading.Lock()


def _bare_handler() -> None:
    """JSON lines go out bare (no level or logger prefix) on stderr, once per process."""
    with _bare:
        if not any(getattr(h, "_lyre_access", False) for h in log.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(message)s"))
            handler._lyre_access = True  # type: ignore[attr-defined]
            log.addHandler(handler)
            log.propagate = False
