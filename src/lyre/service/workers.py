"""The bounded pool that decodes and encodes uploaded audio (enrollment, verification).

``voices.workers`` threads, each at a lower CPU priority than the rest of the process (a Linux
thread has its own nice value), so that a flood of uploads slows uploads, not the engine thread's
steps; at most ``voices.max_in_flight`` jobs of all accounts wait or run at once, more are refused
at once (429); waiting jobs are taken one account at a time, in turn, and one account runs at most
``workers - 1`` at once (with 2 workers, another account's upload never waits behind its encodes). A job takes its place once its upload has been read: an upload that stalls holds
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
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
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
        self._jobs: dict[str, deque[tuple[Future, Callable[..., Any], tuple]]] = {}  # per account, in order
        self._turn: deque[str] = deque()  # accounts with jobs waiting, the next to be served first
        self._ready = threading.Condition()
        self._closed = False
        # an account runs at most this many jobs at once, so that with 2 workers or more another
        # account's job always finds a worker free of the first account's (a long encode)
        self._most_running = max(1, workers - 1)
        self._running: dict[str, int] = {}
        self._threads = [threading.Thread(target=self._work, name=f"lyre-audio-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

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

    async def run(self, fn: Callable[..., T], *args: Any, account: str = "default") -> T:
        """``fn(*args)`` in a worker thread. Waiting jobs are taken one account at a time, in turn
        (one account's flood waits behind itself, not in front of another's upload). A caller
        cancelled meanwhile waits for a job that has started to end before it unwinds, so the place
        it holds is freed only when the work is (a client that cancels and retries cannot pile jobs
        up behind the bound)."""
        work: Future = Future()
        with self._ready:
            if account not in self._jobs:  # an account with nothing waiting goes next (it had no turn lately)
                self._jobs[account] = deque()
                self._turn.appendleft(account)
            self._jobs[account].append((work, fn, args))
            self._ready.notify()
        job = asyncio.wrap_future(work)
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            if not work.cancel():  # (a job not started yet is dropped; a running one is waited for)
                with contextlib.suppress(BaseException):
                    await job
            raise

    def _next(self) -> tuple[str, Future, Callable[..., Any], tuple] | None:
        with self._ready:
            while True:
                if self._closed:
                    return None
                account = next((a for a in self._turn if self._running.get(a, 0) < self._most_running), None)
                if account is not None:
                    break
                self._ready.wait()
            self._turn.remove(account)
            queue = self._jobs[account]
            job = queue.popleft()
            if queue:
                self._turn.append(account)  # its next job after the other accounts' next ones
            else:
                del self._jobs[account]
            self._running[account] = self._running.get(account, 0) + 1
            return (account, *job)

    def _work(self) -> None:
        _lower_priority()
        while (job := self._next()) is not None:
            account, work, fn, args = job
            try:
                if work.set_running_or_notify_cancel():  # (else it was cancelled while it waited)
                    try:
                        work.set_result(fn(*args))
                    except BaseException as e:  # noqa: BLE001 - handed to the caller
                        work.set_exception(e)
            finally:
                with self._ready:
                    self._running[account] -= 1
                    if not self._running[account]:
                        del self._running[account]
                    self._ready.notify_all()

    def join(self, timeout_s: float) -> None:
        """After :meth:`close`: wait for the workers to end (a job running ends first), at most ``timeout_s``."""
        for thread in self._threads:
            thread.join(timeout_s)

    def close(self) -> None:
        with self._ready:
            self._closed = True
            for queue in self._jobs.values():
                for work, _, _ in queue:
                    work.cancel()
            self._jobs.clear()
            self._turn.clear()
            self._ready.notify_all()
