"""The admission gate: an immediate, bounded answer to "may this request come in?", from any thread.

It counts sessions in the system (active + pending), in all and per account: the server holds at
most ``max_active + max_pending``, an account at most its ``max_sessions + max_queued``
(:mod:`lyre.trust.quotas`). Which of them hold KV slots is the scheduler's business.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from lyre.errors import QuotaExceeded
from lyre.trust.quotas import Limits


class Overloaded(Exception):
    def __init__(self, retry_after_s: float):
        super().__init__(f"the server is at capacity; retry after {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


class AdmissionGate:
    """Bounds sessions in the system (active + pending), in all and per account; answers at once."""

    def __init__(self, max_active: int, max_pending: int, limits: Callable[[str], Limits] | None = None):
        self.max_active, self.max_pending = max_active, max_pending
        self.limits = limits  # account -> its Limits; None: accounts are not bounded apart
        self._lock = threading.Lock()
        self._inside = 0
        self.by_account: Counter[str] = Counter()
        self.mean_session_s = 1.0  # exponential mean of finished sessions' durations

    def enter(self, account: str = "default") -> None:
        """Count a new session of ``account``; Overloaded when the server is full, QuotaExceeded when
        the account holds its quota."""
        with self._lock:
            if self._inside >= self.max_active + self.max_pending:
                raise Overloaded(self.retry_after())
            if self.limits is not None:
                mine = self.limits(account)
                most = mine.max_sessions + mine.max_queued
                if self.by_account[account] >= most:
                    raise QuotaExceeded(account, "accounts.max_sessions + accounts.max_queued", most,
                                        "sessions active or queued", self._retry_after(self.by_account[account],
                                                                                       mine.max_sessions))
            self._inside += 1
            self.by_account[account] += 1

    def leave(self, account: str = "default", duration_s: float | None = None) -> None:
        with self._lock:
            self._inside -= 1
            self.by_account[account] -= 1
            if self.by_account[account] <= 0:
                del self.by_account[account]
            if duration_s is not None:
                self.mean_session_s = 0.8 * self.mean_session_s + 0.2 * duration_s

    @property
    def inside(self) -> int:
        return self._inside

    @property
    def full(self) -> bool:
        return self._inside >= self.max_active + self.max_pending

    def retry_after(self) -> float:
        """About when a place frees up: the queue ahead drains max_active sessions per mean session time."""
        return self._retry_after(self._inside, self.max_active)

    def _retry_after(self, inside: int, active: int) -> float:
        waves = 1 + max(0, inside - active) / active
        return round(max(0.1, waves * self.mean_session_s), 1)
