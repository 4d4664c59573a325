"""Waiting for something that no event announces: ask, sleep a little, ask again.

Prefer an event or a stream the code under test offers (a ``threading.Event``, the gRPC health
Watch, a log line); use :func:`until` only where there is none. It never spins: it sleeps between
polls, so the thing it waits for gets the CPU."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.05  # between two polls: short next to any timeout, long enough to leave the CPU to the server


def until(predicate: Callable[[], T], timeout: float = 60.0, what: str = "the condition",
          interval: float = POLL_S) -> T:
    """Call ``predicate`` until it returns something truthy, and return that. Between calls, sleep
    ``interval``. After ``timeout`` seconds, raise AssertionError naming ``what`` and the last value.

    ``timeout`` is a bound for a stuck system, not a measurement: make it generous (tens of seconds)
    so that a loaded machine never trips it."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last value: {value!r}")
        time.sleep(interval)


async def until_async(predicate: Callable[[], T | Awaitable[T]], timeout: float = 60.0,
                      what: str = "the condition", interval: float = POLL_S) -> T:
    """:func:`until` in a coroutine: ``predicate`` may be a plain function or a coroutine function
    (e.g. one that makes a request); the loop sleeps with ``asyncio.sleep`` between polls."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last value: {value!r}")
        await asyncio.sleep(interval)
