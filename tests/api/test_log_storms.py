"""What a hostile client can make the server log: one line per cause per interval with a count, no
traceback, never the bytes it sent (an API key among them)."""

from __future__ import annotations

import logging
import math
import socket
import time

from lyre.api.log_storms import INTERVAL_S, StormFilter

MALFORMED = [  # each answered 400 by aiohttp, which logs it with the offending line quoted
    b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer sk-SECRET-one\x01\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization Bearer sk-SECRET-two\r\n\r\n",
]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_cause_per_interval_with_the_count_and_no_traceback():
    clock, lines = Clock(), []
    logger = logging.getLogger("lyre.tests.storm")
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(logging.Formatter("%(message)s").format(record))
    logger.addHandler(handler)
    logger.addFilter(StormFilter(interval_s=60.0, clock=clock))
    logger.propagate = False
    try:
        for i in range(500):
            clock.now = i * 0.1  # 50 s: one interval
            try:
                raise ValueError("Invalid header value char:\n\n  b'Authorization: Bearer sk-SECRET'")
            except ValueError:
                logger.exception("Error handling request from %s", "203.0.113.9")
        logger.error("accept failed: %s", "EMFILE")  # another cause: its own line
        clock.now = 61.0
        try:
            raise ValueError("Invalid header value char: b'again sk-SECRET'")
        except ValueError:
            logger.exception("Error handling request from %s", "203.0.113.9")
        logger.info("an INFO line is not a storm")
    finally:
        logger.removeHandler(handler)
        logger.filters.clear()
    assert lines == [
        "Error handling request: ValueError: Invalid header value char (at most one line per 60 s for this cause)",
        "accept failed (at most one line per 60 s for this cause)",
        "Error handling request: ValueError: Invalid header value char (499 more like it in the last 61 s) "
        "(at most one line per 60 s for this cause)",
        "an INFO line is not a storm",
    ]
    assert not any("SECRET" in line or "203.0.113.9" in line or "Traceback" in line for line in lines)


def test_malformed_requests_by_the_hundred_log_a_line_per_cause_and_no_secret(server):
    host, port = server.http.removeprefix("http://").rsplit(":", 1)
    mark, start = server.log_mark(), time.monotonic()
    for payload in MALFORMED * 100:
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(payload)
            assert b" 400 Bad Request" in s.recv(64)  # answered, cheaply
    elapsed = time.monotonic() - start
    log = server.log(since=mark)
    assert "SECRET" not in log and "Traceback" not in log
    errors = [line for line in log.splitlines() if "Error handling request" in line]
    # one line per cause per interval: two causes here (an earlier test may have used their lines up)
    assert len(errors) <= 2 * (1 + math.ceil(elapsed / INTERVAL_S)), errors
    assert server.get("/health")[0] == 200


def test_an_error_of_the_servers_own_keeps_its_traceback():
    """Only what a client did is a storm: a handler's exception is logged whole, every time."""
    from aiohttp.http_exceptions import BadHttpMessage

    from lyre.api.log_storms import STORMS

    def record(error: BaseException) -> logging.LogRecord:
        try:
            raise error
        except BaseException as e:
            return logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
                                     ("198.51.100.7",), (type(e), e, e.__traceback__))

    storm = StormFilter(match=STORMS["aiohttp.server"], clock=Clock())
    own = [record(RuntimeError("a bug in a handler")) for _ in range(3)]
    assert all(storm.filter(r) for r in own) and all(r.exc_info is not None for r in own)
    bad = [record(BadHttpMessage("Invalid header value char:\n b'sk-SECRET'")) for _ in range(3)]
    assert [storm.filter(r) for r in bad] == [True, False, False] and bad[0].exc_info is None
