"""The pending queue, fair across accounts: one queue per account, free KV slots shared by weight.

Start-time fair queuing with unit costs (weighted fair queuing; deficit round robin gives the same
shares): each account has a virtual time that one admission advances by ``1 / weight``; the next
session admitted is the head of the waiting account with the least virtual time (ties: the older
head), among those with room (below their ``max_sessions`` KV slots). An account that starts waiting
again starts at the current virtual time, so idling earns no credit. Within an account, sessions
keep their order: an account's backlog delays its own requests, not another account's first audio.
Only the engine thread uses it.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from lyre.core.session import Session

T = TypeVar("T")


def by_account(ordered: list[T], account: Callable[[T], str], turn: int = 0) -> list[T]:
    """``ordered`` taken one item per account in turn (accounts in the order of their first item,
    rotated by ``turn``, so that a budget cut after the first few does not always fall on the same
    account; each account's items in their order). The engine's batch seats and the codec's round are shared
    this way by accounts, not by sessions: one account's many streams cannot starve another's few
    (its many streams, always short of audio, would otherwise always come first)."""
    queues: dict[str, list[T]] = {}
    for item in ordered:
        queues.setdefault(account(item), []).append(item)
    if len(queues) < 2:
        return ordered
    out: list[T] = []
    turns = [iter(q) for q in queues.values()]
    turns = turns[turn % len(turns):] + turns[:turn % len(turns)]
    while turns:
        still = []
        for it in turns:
            item = next(it, None)
            if item is not None:
                out.append(item)
                still.append(it)
        turns = still
    return out


class FairQueue:
    def __init__(self, weight: Callable[[str], float] = lambda account: 1.0):
        self.weight = weight
        self._queues: dict[str, deque[Session]] = {}  # only accounts with sessions waiting
        self._vtime: dict[str, float] = {}  # per account ever seen (accounts come from the config)
        self._now = 0.0  # the virtual time of the last admission

    def append(self, session: Session) -> None:
        queue = self._queues.get(session.account)
        if queue is None:
            queue = self._queues[session.account] = deque()
            self._vtime[session.account] = max(self._vtime.get(session.account, 0.0), self._now)
        queue.append(session)

    def next(self, has_room: Callable[[str], bool]) -> Session | None:
        """The session to admit next (it stays queued until :meth:`remove`); None when every
        waiting account is at its quota of slots."""
        best = None
        for account, queue in self._queues.items():
            if has_room(account):
                key = (self._vtime[account], queue[0].order)
                if best is None or key < best[0]:
                    best = (key, queue[0])
        return None if best is None else best[1]

    def with_room(self, held: Mapping[str, int], allowed: Callable[[str], int]) -> int:
        """How many waiting sessions' accounts have room for them (``held`` slots now, ``allowed`` each)."""
        taken, n = Counter(held), 0
        for queue in self._queues.values():
            for s in queue:
                if taken[s.account] < allowed(s.account):
                    taken[s.account] += 1
                    n += 1
        return n

    def admitted(self, session: Session) -> None:
        """``session`` (the head of its account's queue) got a slot: dequeue it, charge its account."""
        self.remove(session)
        self._now = max(self._now, self._vtime[session.account])  # (never back: see append)
        self._vtime[session.account] += 1.0 / self.weight(session.account)

    def remove(self, session: Session) -> None:
        queue = self._queues[session.account]
        queue.remove(session)
        if not queue:
            del self._queues[session.account]

    def clear(self) -> None:
        self._queues.clear()

    def __iter__(self) -> Iterator[Session]:
        """Every waiting session, oldest first."""
        return iter(sorted((s for q in self._queues.values() for s in q), key=lambda s: s.order))

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __bool__(self) -> bool:
        return bool(self._queues)

    def waiting(self) -> dict[str, int]:
        """Sessions waiting per account."""
        return {account: len(q) for account, q in self._queues.items()}
