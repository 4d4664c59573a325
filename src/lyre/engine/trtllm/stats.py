"""The executor's own figures, as Lyre shows them (``/v1/stats``, Prometheus)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class IterationView:
    """The parts of the executor's latest ``IterationStats`` that Lyre shows."""

    iteration: int = 0
    values: dict[str, float] = field(default_factory=dict)


def latest_iteration(executor: Any, previous: IterationView) -> IterationView:
    """The executor's latest ``IterationStats`` (``previous`` when it has none: KV figures an
    iteration leaves out stay as last known)."""
    try:
        stats = executor.get_latest_iteration_stats()
    except Exception:  # noqa: BLE001 - statistics are best effort
        return previous
    if not stats:
        return previous
    s = stats[-1]
    values: dict[str, float] = {
        "iter_latency_ms": float(s.iter_latency_ms),
        "active_requests": float(s.num_active_requests),
        "queued_requests": float(s.num_queued_requests),
        "gpu_mem_usage_bytes": float(s.gpu_mem_usage),
    }
    kv = s.kv_cache_stats  # optional: an iteration may come without it; the last known figures stay
    if kv is not None:
        values.update(kv_blocks_max=float(kv.max_num_blocks), kv_blocks_free=float(kv.free_num_blocks),
                      kv_blocks_used=float(kv.used_num_blocks), kv_tokens_per_block=float(kv.tokens_per_block))
    else:
        values.update({k: v for k, v in previous.values.items() if k.startswith("kv_")})
    ifb = s.inflight_batching_stats  # optional too
    if ifb is not None:
        values.update(context_requests=float(ifb.num_context_requests),
                      generation_requests=float(ifb.num_gen_requests))
    return IterationView(int(s.iter), values)
