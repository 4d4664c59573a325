"""What the engine thread tells the rest: frozen snapshots, never live structures or loose dicts.

- :class:`SessionMetrics`: how one synthesis went, delivered with its end;
- :class:`StatsSnapshot`: the whole server after a step, published by the scheduler for any thread
  to read; :meth:`StatsSnapshot.as_dict` is seed 004's ``/v1/stats`` JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from lyre.codec.base import CodecStats
from lyre.cpu import LEDGER
from lyre.engine.base import EngineStats


@dataclass(frozen=True)
class SessionMetrics:
    """How one synthesis went."""

    ttfb_ms: float | None  # request received -> first audio; None when none came
    tokens: int  # generated
    prompt_tokens: int
    audio_seconds: float
    elapsed_s: float
    real_time_factor: float | None  # elapsed over audio seconds
    chunks: int
    late_chunks: int  # delivered after the listener had played all the audio before them
    segments: int
    stop_reason: str | None = None  # how its generation ended (STOP_REASONS): the worst of its segments'

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# an engine's finish reason -> how a generation stopped, as reported (metrics, audit rows): the model's
# end of speech; a cap (max_tokens, a Qwen3-TTS segment's frame cap, a full slot); the repetition guard
STOP_REASONS = {"stop": "end_of_speech", "length": "length", "repetition": "repetition"}
_STOP_RANK = {None: -1, "end_of_speech": 0, "length": 1, "repetition": 2}


def worst_stop(a: str | None, b: str | None) -> str | None:
    """The stop reason that says more was wrong (a cap over end of speech, a runaway over a cap)."""
    return a if _STOP_RANK[a] >= _STOP_RANK[b] else b


@dataclass(frozen=True)
class SchedulerStats:
    total_sessions: int
    active_sessions: int  # holding a KV slot
    pending_sessions: int  # admitted, waiting for a slot
    max_concurrent: int
    policy: str
    throttled_sessions: int  # not generating: their clients hold scheduler.max_buffer_s of unread audio
    batch_sessions: int = 0  # batch items holding a KV slot (lower class: not in the figures above)
    batch_waiting: int = 0  # batch items handed to the engine thread, waiting for a slot live work leaves free


@dataclass(frozen=True)
class KVCacheStats:
    used_slots: int
    free_slots: int


@dataclass(frozen=True)
class AccountLoad:
    active_sessions: int  # holding a KV slot
    pending_sessions: int  # waiting for one


@dataclass(frozen=True)
class StatsSnapshot:
    """The server after the engine thread's last step."""

    scheduler: SchedulerStats
    kv_cache: KVCacheStats
    engine: EngineStats
    codec: CodecStats | None
    capacity_utilisation: float  # active + pending sessions over the KV slots: the figure to autoscale on
    extra: Mapping[str, Any] = field(default_factory=dict)  # a peer's own figures (the benchmark's baseline)
    accounts: Mapping[str, AccountLoad] = field(default_factory=dict)  # the accounts with sessions

    @property
    def total_tokens(self) -> int:
        return self.engine.total_tokens

    @property
    def total_batches(self) -> int:
        return self.engine.total_steps

    def as_dict(self, account: str | None = None) -> dict[str, Any]:
        """Seed 004's ``/v1/stats`` JSON (scheduler, kv_cache, total_tokens, total_batches), with the
        engine's and the codec's figures. For one ``account`` (not an operator): the server's load and
        that account's own sessions, not the engine's and codec's figures, which move by one request's
        detail (the prefix cache's bytes and the prefilled tokens by a cloned voice's clip length)."""
        load = {
            "scheduler": asdict(self.scheduler),
            "kv_cache": asdict(self.kv_cache),
            "total_tokens": self.total_tokens,
            "total_batches": self.total_batches,
            "capacity_utilisation": self.capacity_utilisation,
        }
        if account is not None:
            return {**load, "account": {"name": account,
                                        **asdict(self.accounts.get(account, AccountLoad(0, 0)))}}
        e = self.engine
        return {
            **load,
            "engine": {"backend": e.backend, "kv_cache_bytes": e.kv_cache_bytes, "prompt_tokens": e.prompt_tokens,
                       "prefilled_tokens": e.prefilled_tokens, **e.extra},
            "codec": self.codec.as_dict() if self.codec is not None else {},
            "accounts": {a: asdict(load) for a, load in sorted(self.accounts.items())},
            "cpu_seconds": LEDGER.snapshot(),  # this process's CPU time, by part (lyre.cpu)
            **self.extra,
        }
