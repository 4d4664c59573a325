"""The admission gate: an immediate, bounded answer to "may this request come in?", from any thread."""

from __future__ import annotations

import threading


class Overloaded(Exception):
    def __init__(self, retry_after_s: float):
        super().__init__(f"the server is at capacity; retry after {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


class AdmissionGate:
    """Bounds sessions in the system (active + pending) and answers at once, from any thread."""

    def __init__(self, max_active: int, max_pending: int):
        self.max_active, self.max_pending = max_active, max_pending
        self._lock = threading.Lock()
        self._inside = 0
        self.mean_session_s = 1.0  # exponential mean of finished sessions' durations

    def enter(self) -> None:
        with self._lock:
            if self._inside >= self.max_active + self.max_pending:
                raise Overloaded(self.retry_after())
            self._inside += 1

    def leave(self, duration_s: float | None = None) -> None:
        with self._lock:
            self._inside -= 1
            if duration_s is not None:
                self.mean_session_s = 0.8 * self.mean_session_s + 0.2 * duration_s

    @property
    def inside(self) -> int:
        return self._inside

    def retry_after(self) -> float:
        """About when a place frees up: the queue ahead drains max_active sessions per mean session time."""
        waves = 1 + max(0, self._inside - self.max_active) / self.max_active
        return round(max(0.1, waves * self.mean_session_s), 1)
