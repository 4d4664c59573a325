"""Quotas: what each account may hold at once, and its share of the server when accounts wait.

Every account (the configured keys' accounts; without keys, everyone is ``default``) has
:class:`Limits`, from ``accounts.quotas.<account>``, else ``accounts.default``, else derived from
the server's size: with several accounts, one may hold at most 3/4 of the KV slots (and of the
pending queue, of the WebSocket contexts the server can speak for) and a quarter of the audio
workers' places (``voices.max_in_flight``) for enrollments and another for verifications, so that
another's first request always finds room. A server with one
account gives it every slot and queued place, and no derived bound on contexts, enrollments and
verifications: that account is everyone (per-address and server-wide limits bound them), and a
bound on it would be a place one client could take from all the others.

Who counts what: the admission gate (:mod:`lyre.core.admission`) counts an account's sessions
(active + queued), the scheduler's fair queue (:mod:`lyre.core.fair`) keeps it to ``max_sessions``
KV slots and shares free slots by ``weight``; :class:`Quotas` counts the rest (WebSocket contexts,
enrollments and verifications in flight, characters per minute), on the asyncio side. A refusal is
:class:`~lyre.errors.QuotaExceeded`: 429 / RESOURCE_EXHAUSTED with Retry-After, naming the quota.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from lyre.config import LyreConfig
from lyre.errors import QuotaExceeded, TextTooLong

SHARED = 0.75  # with several accounts, the most of any server-wide capacity one account may hold
UNBOUNDED = 1 << 30
_WHAT_KEYS = ("max_ws_contexts", "max_enrollments", "max_verifies")
WINDOW_S = 60.0  # chars_per_minute is counted over this window


@dataclass(frozen=True)
class Limits:
    max_sessions: int
    max_queued: int
    max_ws_contexts: int
    max_enrollments: int
    max_verifies: int
    chars_per_minute: int  # 0 = no limit
    weight: float
    batch_items: int = UNBOUNDED  # batch items queued or running, over all its batches
    batch_input_bytes: int = 50 * 2**20  # one batch's JSONL input
    batch_slots: int = UNBOUNDED  # its batch items running at once on this server


def limits_for(cfg: LyreConfig, accounts: Sequence[str]) -> dict[str, Limits]:
    """Each of ``accounts``' limits (see the module's docstring)."""
    s, shared = cfg.scheduler, len(accounts) > 1

    def part(whole: int, least: int = 1) -> int:
        return max(least, int(whole * SHARED)) if shared else whole

    # of the audio workers' places, an account's enrollments and its verifications each take at most
    # a quarter: half of them at most, so another account's upload always finds one
    uploads = max(1, cfg.voices.max_in_flight // 4)
    places = dict(max_ws_contexts=part(s.max_concurrent_sessions + s.max_pending), max_enrollments=uploads,
                  max_verifies=uploads) if shared else dict.fromkeys(_WHAT_KEYS, UNBOUNDED)
    running = cfg.batch.max_running or s.max_batch_size
    derived = dict(max_sessions=part(s.max_concurrent_sessions), max_queued=part(s.max_pending, 0), **places,
                   chars_per_minute=0, weight=1.0, batch_items=100_000, batch_input_bytes=50 * 2**20,
                   batch_slots=part(running))
    out = {}
    for account in accounts:
        given = cfg.accounts.quotas.get(account)
        out[account] = Limits(**{
            key: next(v for v in (getattr(given, key, None), getattr(cfg.accounts.default, key), fallback)
                      if v is not None)
            for key, fallback in derived.items()})
    return out


# what QuotaExceeded names: the config key, and what the account holds too many of
_WHAT = {"ws_contexts": "WebSocket contexts open", "enrollments": "enrollments in flight",
         "verifies": "verifications in flight"}


class Quotas:
    """The asyncio side's per-account counters (thread-safe: gRPC and HTTP share one loop, a
    library user may bring others)."""

    def __init__(self, cfg: LyreConfig, accounts: Sequence[str], clock: Callable[[], float] = time.monotonic,
                 on_refusal: Callable[[str, str], None] = lambda account, key: None):
        self.limits = limits_for(cfg, accounts)
        self.on_refusal = on_refusal  # (account, the quota's config key): counted in the metrics
        self.clock = clock
        self._lock = threading.Lock()
        self.held: dict[str, Counter[str]] = {a: Counter() for a in self.limits}
        self._chars: dict[str, list[tuple[float, int]]] = {a: [] for a in self.limits}  # (when, how many)

    def of(self, account: str) -> Limits:
        """An account's limits (a library caller's unconfigured account: the default's)."""
        found = self.limits.get(account)
        return found if found is not None else self.limits.get("default") or next(iter(self.limits.values()))

    def take(self, account: str, what: str, retry_after_s: float = 1.0) -> Callable[[], None]:
        """One ``what`` ("ws_contexts", "enrollments", "verifies") of ``account``, until the returned
        release is called (once is enough; more calls do nothing); QuotaExceeded when it holds its
        quota already."""
        limit = getattr(self.of(account), f"max_{what}")
        with self._lock:
            held = self.held.setdefault(account, Counter())
            if held[what] >= limit:
                self.on_refusal(account, f"accounts.max_{what}")
                raise QuotaExceeded(account, f"accounts.max_{what}", limit, _WHAT[what], retry_after_s)
            held[what] += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if not released:
                    released = True
                    held[what] -= 1

        return release

    @contextlib.contextmanager
    def hold(self, account: str, what: str) -> Iterator[None]:
        """:meth:`take` for the ``with`` block."""
        release = self.take(account, what)
        try:
            yield
        finally:
            release()

    def usage(self, account: str) -> dict[str, int]:
        """What ``account`` holds of the places counted here."""
        with self._lock:
            held = self.held.get(account, Counter())
            return {what: held[what] for what in _WHAT}

    def charge_chars(self, account: str, n: int) -> None:
        """Count ``n`` characters of text against ``account``'s chars_per_minute, or raise
        QuotaExceeded (nothing counted) with the wait until they would fit."""
        limit = self.of(account).chars_per_minute
        if not limit or n <= 0:
            return
        now = self.clock()
        with self._lock:
            spent = self._chars.setdefault(account, [])
            while spent and spent[0][0] <= now - WINDOW_S:
                spent.pop(0)
            used = sum(k for _, k in spent)
            if n > limit:
                raise TextTooLong(f"the text has {n} characters; account {account!r} may send at most {limit} a "
                                  "minute (accounts.chars_per_minute)")
            if used + n > limit:  # wait until enough of the window's characters have aged out
                freed, wait = 0, WINDOW_S
                for when, k in spent:
                    freed += k
                    if used - freed + n <= limit:
                        wait = when + WINDOW_S - now
                        break
                self.on_refusal(account, "accounts.chars_per_minute")
                raise QuotaExceeded(account, "accounts.chars_per_minute", limit,
                                    f"characters a minute ({used} taken in the last minute; this request has {n})",
                                    wait)
            spent.append((now, n))
