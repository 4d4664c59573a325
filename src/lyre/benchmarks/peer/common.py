"""What the benchmark's peers (``--baseline transformers`` and ``llamacpp``) share: the part of a
stream the front ends read, and the ``/v1/stats`` snapshot of a server that has no scheduler,
codec or KV cache of Lyre's."""

from __future__ import annotations

import time
from typing import Any

from lyre.core.stats import KVCacheStats, SchedulerStats, SessionMetrics, StatsSnapshot
from lyre.engine.base import EngineStats


class PeerStream:
    """A peer's synthesis as the front ends see it; subclasses make the audio (``__anext__``)."""

    def __init__(self, service: Any, prompts: list[list[int]], sampling: Any, id_prefix: str):
        self._service, self._prompts, self._sampling = service, prompts, sampling
        self.session_id = f"{id_prefix}{next(service._ids)}"
        self.metrics: SessionMetrics | None = None
        self.timeline = None  # (no timestamps: the peer places no text in its audio)
        self.segment_texts: list[str] = []
        self.segment_places: list = []
        self._created = time.monotonic()
        self._cancelled = False

    def __aiter__(self) -> PeerStream:
        return self


def peer_stats(backend: str, policy: str, capacity: int, busy: int, waiting: int, sessions: int, tokens: int,
               steps: int) -> StatsSnapshot:
    """``busy`` requests generating of ``capacity``, ``waiting`` queued (utilisation: the busy share)."""
    return StatsSnapshot(
        scheduler=SchedulerStats(total_sessions=sessions, active_sessions=busy, pending_sessions=waiting,
                                 max_concurrent=capacity, policy=policy, throttled_sessions=0),
        kv_cache=KVCacheStats(used_slots=busy, free_slots=capacity - busy),
        engine=EngineStats(capacity=capacity, active=busy, waiting=waiting, prefilling=0, total_requests=sessions,
                           total_tokens=tokens, total_steps=steps, kv_cache_bytes=0, backend=backend),
        codec=None, capacity_utilisation=busy / capacity)
