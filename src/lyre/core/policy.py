"""Which active sessions decode this step, most urgent first (``scheduler.policy``).

Both policies put new sessions (fewer than ``ttfb_priority_tokens`` tokens) first; they differ in
the rest. Over either order lies backpressure from the listener's clock (:meth:`Policy.decode_order`):
a session whose client leaves ``max_buffer_s`` of audio unread is throttled (its tokens are not
needed yet), and a session more than ``max_buffer_s`` ahead of its listener yields its seat while
any other session still needs audio; while a new session waits for its first audio, only sessions
within ``first_audio_slack_s`` of running dry run beside it (a shorter step: on a CPU a step's cost
grows with its rows). The seats of a step go to accounts in turn (:func:`lyre.core.fair.by_account`):
an account with many streams gets more of the batch only when nobody else needs it.
"""

from __future__ import annotations

from lyre.config import SchedulerConfig
from lyre.core.fair import by_account
from lyre.core.session import Session


class Policy:
    def __init__(self, cfg: SchedulerConfig):
        self.cfg = cfg

    def is_new(self, s: Session) -> bool:
        return s.tokens < self.cfg.ttfb_priority_tokens

    def order(self, sessions: list[Session], step: int, now: float) -> list[Session]:
        """``sessions`` most urgent first."""
        raise NotImplementedError

    def decode_order(self, sessions: list[Session], step: int, now: float) -> list[Session]:
        """The sessions that may decode this step, most urgent first (the engine takes the first
        ``max_batch_size`` that are ready)."""
        ordered = self.order([s for s in sessions if not s.throttled], step, now)
        needy = [s for s in ordered if s.slack(now) <= self.cfg.max_buffer_s]
        if self.cfg.first_audio_slack_s > 0 and any(self.is_new(s) for s in needy):
            # someone waits for a first audio: a short step, with only those about to run dry beside it
            needy = [s for s in needy if self.is_new(s) or s.slack(now) <= self.cfg.first_audio_slack_s]
        return by_account(needy or ordered, lambda s: s.account)  # far-ahead ones run only when nobody needs audio


class FairPolicy(Policy):
    """Seed 004: sessions that have waited max_wait_steps first (the starvation bound), then new
    sessions, then the rest round-robin."""

    def order(self, sessions, step, now):
        def key(s: Session):
            starving = step - s.last_run_step > self.cfg.max_wait_steps
            return (not starving, not self.is_new(s), s.last_run_step, s.order)

        return sorted(sessions, key=key)


class DeadlinePolicy(Policy):
    """New sessions first, then least playback slack (audio delivered minus audio played): a session
    far ahead of its listener yields its turn to one about to run dry. A waiting session's slack
    shrinks as its listener plays, so nobody waits for ever."""

    def order(self, sessions, step, now):
        return sorted(sessions, key=lambda s: (not self.is_new(s), s.slack(now), s.order))


POLICIES = {"fair": FairPolicy, "deadline": DeadlinePolicy}
