"""The batch lane: batch jobs' items, a lower class of session that fills what live work leaves free.

A batch session (``Session.batch``) is one segment of a batch item. It never passes the admission
gate (a batch backlog neither fills the server nor makes it "full" for ``/ready``), and it has no
listener: no playback clock, no slow-consumer or session timeout; its audio is produced at full
speed. The scheduler gives the lane, in order of precedence:

- **KV slots** only where no live session waits and more than ``scheduler.reserved_slots`` are
  free, so that most live arrivals find a slot at once;
- **eviction** when a live session waits and no slot is free: the batch sessions with the fewest
  tokens generated (the least work lost) are cancelled with reason ``evicted``; their slots are free at the
  next engine step, where the live session takes one. The item's runner (:mod:`lyre.service.batch`)
  generates the evicted segment again later — a segment is at most one text segment (~280
  characters), so an eviction loses at most that much work;
- **steps** only where every live session holds ``scheduler.batch_live_slack_s`` of audio its
  listener has not played yet (at most half of what it can hold when its client reads in real time,
  ``scheduler.max_buffer_s`` of audio played ``tempo`` times faster: more would never let the lane run) — none while a live session waits for its first audio or is about
  to run dry. In such a step batch sessions get the decode seats live ones leave, their prompts
  prefill (a batch prompt never prefills in another step: the engine's negative priority), and
  their frames get what a codec round leaves after every live job
  (:class:`~lyre.core.pipeline.AudioPipeline`). On a CPU a step's and a round's cost grow with their
  rows: batch work would slow the live sessions that need their next audio now. Live sessions fill
  their buffers in the short steps, then the lane runs while they play.

Why evict rather than pause in place: a paused session still holds its slot, which is what the live
request needs. Why regenerate the segment rather than recompute its KV from the codes generated so far:
that needs the engines (PyTorch and TensorRT-LLM) to take generated ids as a resumed prompt with the
frame-slot position, the repetition window and the seeded sampler's state carried over — a change
of the engine contract left for later (docs/batch.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from lyre.core.fair import by_account
from lyre.core.session import ACTIVE, PENDING, Session

EVICTED = "evicted"


class BatchLane:
    """The batch sessions the engine thread holds: waiting for a slot, or in one."""

    def __init__(self, live_slack_s: float = 1.0, max_buffer_s: float = 2.0) -> None:
        self.live_slack_s = live_slack_s  # what every live session must hold for the lane to run (may_decode)
        self.max_buffer_s = max_buffer_s  # the most unread audio a live session's client holds
        self.waiting: deque[Session] = deque()
        self.active: dict[str, Session] = {}
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.waiting) + len(self.active)

    def sessions(self) -> list[Session]:
        return [*self.waiting, *self.active.values()]

    def admitted(self, s: Session) -> None:
        self.waiting.remove(s)
        self.active[s.session_id] = s

    def leave(self, s: Session) -> bool:
        """Forget ``s`` (it ended); False when it was not the lane's."""
        if self.active.pop(s.session_id, None) is not None:
            return True
        try:
            self.waiting.remove(s)
        except ValueError:
            return False
        return True

    def evict(self, needed: int, end: Callable[[Session], None]) -> None:
        """End (``end``) up to ``needed`` active batch sessions: those with the fewest tokens (least work lost)."""
        for victim in sorted(self.active.values(), key=lambda s: (s.tokens, -s.order))[:needed]:
            self.evictions += 1
            end(victim)

    def admit(self, engine: Any, reserved: int, submit: Callable[[Session], bool]) -> None:
        """Waiting batch sessions into the engine's free slots, keeping ``reserved`` free (``submit``
        adds one's first segment: False when no slot is free; a session it ends is no longer waiting)."""
        while self.waiting:
            e = engine.stats()
            if e.capacity - e.active - e.waiting <= reserved:
                return
            s = self.waiting[0]
            if not submit(s) and s.status == PENDING:
                return
            if s.status == PENDING:
                s.status = ACTIVE
                self.admitted(s)

    def may_decode(self, live: Iterable[Session], is_new: Callable[[Session], bool], now: float) -> bool:
        """Whether batch sessions decode this step: no live session waits for its first audio or holds
        less than ``live_slack_s`` of listening its listener has yet to play — or, for one whose client
        reads in real time, half what it can hold at most (``max_buffer_s`` of audio, played ``tempo``
        times faster), or the lane would never run beside it."""
        return all(not is_new(s) and s.slack(now) >= min(self.live_slack_s, self.max_buffer_s / 2 / s.tempo)
                   for s in live)

    def seats(self, generating: Iterable[Session], live_seats: int, max_batch: int, turn: int) -> list[Session]:
        """The batch sessions that may decode this step after ``live_seats`` live ones, accounts in turn."""
        room = max_batch - live_seats
        if room <= 0:
            return []
        ordered = sorted(generating, key=lambda s: s.order)
        return by_account(ordered, lambda s: s.account, turn)[:room]


def split(sessions: dict[Session, str], is_batch: Callable[[Session], bool] = lambda s: s.batch
          ) -> tuple[dict[Session, str], dict[Session, str]]:
    """``sessions`` (session -> request id) into live and batch."""
    live = {s: r for s, r in sessions.items() if not is_batch(s)}
    return live, {s: r for s, r in sessions.items() if is_batch(s)}
