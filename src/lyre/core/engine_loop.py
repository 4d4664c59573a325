"""The engine thread: the one thread that runs the scheduler (and through it the token engine and
the codec). Everything else talks to it by message."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from lyre.core.scheduler import Scheduler
from lyre.core.session import FAILED
from lyre.errors import ServiceUnavailable

log = logging.getLogger("lyre.service")




class EngineLoop:
    """The one thread that runs the scheduler. Work arrives as callables in its inbox."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.inbox: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="lyre-engine", daemon=True)
        self.alive = False
        self.closing = False
        self._lock = threading.Lock()
        self.error: BaseException | None = None

    def start(self) -> None:
        self.alive = True
        self.thread.start()

    def post(self, fn: Callable[[], None]) -> bool:
        """Queue ``fn`` for the engine thread; False (nothing queued) once the loop is closing or has
        stopped. Nothing is ever queued behind the stop message, so every queued ``fn`` runs."""
        with self._lock:
            if self.closing or not self.alive:
                return False
            self.inbox.put(fn)
            return True

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine thread between steps and return its result (or raise what it raised)
        to the awaiting coroutine; ServiceUnavailable once the loop is closing."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def run() -> None:
            try:
                outcome = (done.set_result, fn())
            except Exception as e:  # handed to the caller
                outcome = (done.set_exception, e)
            try:
                loop.call_soon_threadsafe(_settle, done, *outcome)
            except RuntimeError:  # (its event loop has closed: nobody waits)
                pass

        if not self.post(run):
            raise ServiceUnavailable("the service is shutting down")
        return await done

    def request_stop(self) -> None:
        """Refuse new messages from now on; the loop runs what is queued, then shuts the scheduler down."""
        with self._lock:
            if not self.closing:
                self.closing = True
                self.inbox.put(None)

    def stop(self) -> None:
        self.request_stop()
        self.thread.join()

    def _run(self) -> None:
        try:
            idle_wait: float | None = None
            while True:
                for fn in self._take(block=not self.scheduler.has_work(), timeout=idle_wait):
                    if fn is None:
                        self.scheduler.shutdown()
                        return
                    try:
                        fn()
                    except Exception:  # a message about one request must not stop everyone's loop
                        log.exception("a message to the engine loop failed")
                progressed = self.scheduler.step() if self.scheduler.has_work() else False
                self.scheduler.publish()
                # Sessions are open but nothing moved (e.g. all waiting on their consumers): wait for
                # a message briefly instead of spinning.
                idle_wait = None if progressed else 0.002
        except BaseException as e:  # the loop must never die silently, nor leave anyone waiting
            log.exception("engine loop stopped")
            self.error = e
            self.alive = False
            try:
                self.scheduler.shutdown(FAILED, f"the engine loop stopped: {type(e).__name__}: {e}")
            except Exception:
                log.exception("could not fail the open sessions")
        finally:
            with self._lock:
                self.alive = False
                self.closing = True
            self._run_leftovers()

    def _run_leftovers(self) -> None:
        """Messages queued before the loop died: run against the shut-down scheduler (which ends a
        submitted session at once), so nobody waits for an answer that never comes."""
        for fn in self._take(block=False, timeout=None):
            if fn is not None:
                try:
                    fn()
                except Exception:
                    log.exception("a message to the stopped engine loop failed")

    def _take(self, block: bool, timeout: float | None) -> list[Callable[[], None] | None]:
        items = []
        try:
            if block:
                items.append(self.inbox.get())
            elif timeout:
                items.append(self.inbox.get(timeout=timeout))
            while True:
                items.append(self.inbox.get_nowait())
        except queue.Empty:
            pass
        return items


def _settle(future: asyncio.Future, how: Callable[[Any], None], value: Any) -> None:
    """(On the caller's loop.) The result for a caller still waiting: one that was cancelled meanwhile is not."""
    if not future.done():
        how(value)
