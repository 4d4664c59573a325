"""One synthesis's audit row while it runs (:class:`AuditEntry`) and the outcome its ending gives
the row (:func:`row_outcome`); :mod:`lyre.trust.audit` writes them."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

import numpy as np

from lyre.model import orpheus


class Recorder(Protocol):
    """What writes an entry's row (:class:`lyre.trust.audit.AuditTrail`)."""

    instance: str

    def record(self, op: dict[str, Any], taken: Callable[[], None] | None = None) -> None: ...

# a synthesis's ending (the engine's outcome and reason) -> the row's outcome
_CANCELLED = {"cancelled": "cancelled", "slow_consumer": "slow_consumer", "timeout": "timeout", "shutdown": "shutdown"}


def row_outcome(outcome: str, reason: str | None) -> tuple[str, str]:
    """(outcome, reason) of the row for how a synthesis ended (the scheduler's finished with how its
    generation stopped, cancelled with its reason, failed with its reason)."""
    if outcome == "finished":  # (reason: how its generation stopped, lyre.core.stats.STOP_REASONS)
        return "completed", reason or ""
    if outcome == "cancelled" and reason in _CANCELLED:
        return _CANCELLED[reason], "" if reason == "cancelled" else reason
    return "error", (reason or outcome)[:64]



@dataclass
class AuditEntry:
    """One synthesis being recorded: its text and PCM are hashed as they go by."""

    trail: Recorder | None
    account: str
    voice: str
    protocol: str
    started: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    _text: Any = field(default_factory=hashlib.sha256)
    _pcm: Any = field(default_factory=hashlib.sha256)
    samples: int = 0
    done: bool = False
    entry_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    begun: bool = False
    _recorded: asyncio.Future | None = None  # done once the writer has taken the start row
    trace: str | None = None  # a batch item's "<batch id>/<custom_id>" (the audit row's trace column)

    def add_text(self, text: str) -> None:
        self._text.update(text.encode("utf-8", "surrogatepass"))

    def add_pcm(self, pcm: np.ndarray) -> None:
        """int16 24 kHz samples as delivered."""
        self._pcm.update(np.ascontiguousarray(pcm, dtype="<i2").tobytes())
        self.samples += int(pcm.size)

    def begin(self) -> None:
        """The synthesis starts (admitted): its row is written now, as ``started`` (once)."""
        if self.begun or self.trail is None:
            return
        self.begun = True
        self.started = datetime.now(timezone.utc)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        future = loop.create_future() if loop is not None else None
        self._recorded = future
        row = {**self._row("started", ""), "ended": None}
        self.trail.record({"op": "start", "row": row}, (lambda: _resolve_from_thread(loop, future))
                          if future is not None else None)

    async def recorded(self) -> None:
        """Wait until the start row is written (or spooled): the first audio goes out after it."""
        if self._recorded is not None and not self._recorded.done():
            await asyncio.shield(self._recorded)  # (shared by the utterance's pieces: one cancelled waiter is no more)

    def ending(self, outcome: str, reason: str | None = None) -> dict[str, Any]:
        """The values that complete the row for how the synthesis ended (what :meth:`finish` writes;
        a batch item's are also written in the transaction that completes the item)."""
        outcome, reason = row_outcome(outcome, reason)
        return {"outcome": outcome, "reason": reason, "audio_seconds": self.samples / orpheus.SAMPLE_RATE,
                "text_sha256": self._text.hexdigest(), "pcm_sha256": self._pcm.hexdigest(),
                "ended": datetime.now(timezone.utc)}

    def finish(self, outcome: str, reason: str | None = None, ending: dict[str, Any] | None = None) -> None:
        """Complete the row for how the synthesis ended (the scheduler's outcome and reason, or the
        :meth:`ending` computed before; once)."""
        if self.done:
            return
        self.done = True
        if self.trail is None:
            return
        ending = ending or self.ending(outcome, reason)
        if self.begun:
            self.trail.record({"op": "end", "entry_id": self.entry_id, "values": ending})
        else:  # it ended before it started (refused, or an utterance cancelled before any piece)
            self.trail.record({"op": "row", "row": {**self._row(ending["outcome"], ending["reason"]), **ending}})

    def _row(self, outcome: str, reason: str) -> dict[str, Any]:
        return {"time": self.started, "account": self.account, "voice": self.voice, "protocol": self.protocol,
                "outcome": outcome, "reason": reason, "audio_seconds": 0.0, "text_sha256": self._text.hexdigest(),
                "pcm_sha256": self._pcm.hexdigest(), "entry_id": self.entry_id,
                "instance": self.trail.instance if self.trail is not None else None, "trace": self.trace}


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _resolve_from_thread(loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> None:
    """(The writer thread's call; the loop that waits may have closed meanwhile: nobody waits then.)"""
    try:
        loop.call_soon_threadsafe(_resolve, future)
    except RuntimeError:
        pass
