"""Prometheus metrics and the seed 004 ``/v1/stats`` snapshot.

Each :class:`Metrics` has its own registry, so several services (tests) never collide. Per-account
figures carry an ``account`` label bounded by the configured accounts (any other name a library
caller passes counts as ``other``).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
_STEP_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class _ExecutorGauges:
    """The TensorRT-LLM executor's own figures."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.iteration_ms = Gauge("lyre_engine_iteration_latency_ms", "Latest TensorRT-LLM iteration latency",
                                  registry=r)
        self.kv_blocks = Gauge("lyre_kv_cache_blocks", "TensorRT-LLM paged KV cache blocks", ["state"], registry=r)
        self.engine_queued = Gauge("lyre_engine_queued_requests", "Requests queued inside the TensorRT-LLM executor",
                                   registry=r)


class Metrics:
    def __init__(self, accounts: tuple[str, ...] = ("default",)) -> None:
        self.registry = r = CollectorRegistry()
        self._accounts = frozenset(accounts)
        self.account_sessions = Gauge("lyre_account_sessions", "An account's sessions holding a KV slot (active) "
                                      "and waiting for one (pending)", ["account", "state"], registry=r)
        self.account_refusals = Counter("lyre_account_refusals", "Requests refused because the account held its "
                                        "quota, by the quota's config key", ["account", "quota"], registry=r)
        self.account_characters = Counter("lyre_account_characters", "Text characters taken for synthesis",
                                          ["account"], registry=r)
        self.connections_open = Gauge("lyre_connections_open", "Open connections on the REST/WebSocket port",
                                      registry=r)
        self.connections_refused = Counter("lyre_connections_refused", "Connections closed at accept, by the cap "
                                           "reached (server.max_connections, server.max_connections_per_client)",
                                           ["reason"], registry=r)
        self.connections_cut = Counter("lyre_connections_cut", "Connections cut for a slow request (headers not "
                                       "complete in time, a body below the minimum rate)", ["reason"], registry=r)
        for account in sorted(self._accounts):
            for state in ("active", "pending"):
                self.account_sessions.labels(account=account, state=state).set(0)
        self.ttfb = Histogram("lyre_ttfb_seconds", "Request received to first audio chunk", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.step_seconds = Histogram("lyre_step_seconds", "Engine step time (token step, routing, audio)",
                                      buckets=_STEP_BUCKETS, registry=r)
        self.batch_size = Histogram("lyre_batch_size", "Sessions that produced a token in a step",
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.active = Gauge("lyre_active_sessions", "Sessions holding a KV slot", registry=r)
        self.pending = Gauge("lyre_pending_sessions", "Sessions waiting for a KV slot", registry=r)
        self.kv_slots_used = Gauge("lyre_kv_slots_used", "KV cache slots in use", registry=r)
        self.utilisation = Gauge("lyre_capacity_utilisation", "Active + pending sessions over the KV slots "
                                 "(max_concurrent_sessions): 1 = every slot busy, above 1 callers wait; autoscale on "
                                 "it", registry=r)
        self.tokens = Counter("lyre_tokens", "Generated tokens", registry=r)
        self.audio_seconds = Counter("lyre_audio_seconds", "Audio delivered, in seconds", registry=r)
        self.rejections = Counter("lyre_rejections", "Requests refused", ["reason"], registry=r)
        self.late_chunks = Counter("lyre_late_chunks", "Chunks delivered after the listener's audio ran out",
                                   registry=r)
        self.sessions = Counter("lyre_sessions", "Sessions ended, by outcome", ["outcome"], registry=r)
        self._executor: _ExecutorGauges | None = None  # registered with the first TensorRT-LLM statistics
        self.codec_decoded = Counter("lyre_codec_frames_decoded", "Frames run through the SNAC decoder (padding and "
                                     "warm-up decodes included)", registry=r)
        self.codec_emitted = Counter("lyre_codec_frames_emitted", "Frames of audio emitted by the codec", registry=r)
        self.codec_seconds = Counter("lyre_codec_decode_seconds", "Time spent in SNAC decode calls", registry=r)
        self._codec_seen = (0, 0.0, 0.0)
        self.prompt_tokens = Counter("lyre_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.prefilled_tokens = Counter("lyre_prefilled_tokens", "Prompt tokens run through the model (the rest "
                                        "came from kept prefixes: cloned voices' reference turns)", registry=r)
        self.prefix_bytes = Gauge("lyre_prefix_cache_bytes", "K/V of kept prompt prefixes", registry=r)
        self.prefix_entries = Gauge("lyre_prefix_cache_entries", "Kept prompt prefixes", registry=r)
        self.prefix_evictions = Counter("lyre_prefix_cache_evictions", "Kept prefixes evicted to make room",
                                        registry=r)
        self.prefix_lookups = Counter("lyre_prefix_cache_lookups", "Admissions that looked for a kept prefix",
                                      ["result"], registry=r)
        self._engine_seen = (0, 0, 0, 0, 0)
        self.total_batches = 0
        # the two lanes (lyre.core.lanes): sessions holding a KV slot; batch jobs' items
        self.lane_sessions = Gauge("lyre_lane_sessions", "Sessions holding a KV slot, by lane (live, batch)", ["lane"],
                                   registry=r)
        self.batch_items = Gauge("lyre_batch_items", "Batch items queued and running, over every server sharing the "
                                 "database", ["state"], registry=r)
        self.batch_oldest = Gauge("lyre_batch_oldest_queued_seconds", "Age of the oldest queued batch item",
                                  registry=r)
        self.batch_finished = Counter("lyre_batch_items_finished", "Batch items ended on this server (expired: by "
                                      "any), by outcome", ["outcome"], registry=r)
        self.batch_audio = Counter("lyre_batch_audio_seconds", "Audio of completed batch items, in seconds",
                                   registry=r)
        self.batch_evictions = Counter("lyre_batch_evictions", "Batch segments whose KV slot went to a live caller "
                                       "(generated again)", registry=r)
        for lane in ("live", "batch"):
            self.lane_sessions.labels(lane=lane).set(0)
        for state in ("queued", "running"):
            self.batch_items.labels(state=state).set(0)
        for outcome in ("completed", "failed", "cancelled", "expired"):
            self.batch_finished.labels(outcome=outcome)

    def observe_step(self, seconds: float, batch: int) -> None:
        self.step_seconds.observe(seconds)
        self.batch_size.observe(batch)
        self.total_batches += 1

    def set_load(self, active: int, pending: int, slots_used: int, utilisation: float = 0.0) -> None:
        self.utilisation.set(utilisation)
        self.active.set(active)
        self.pending.set(pending)
        self.kv_slots_used.set(slots_used)

    def _account(self, account: str) -> str:
        return account if account in self._accounts else "other"

    def set_accounts(self, active: Mapping[str, int], pending: Mapping[str, int]) -> None:
        """Each account's active and pending sessions (accounts absent from both: 0)."""
        totals = {(a, state): 0 for a in self._accounts for state in ("active", "pending")}
        for state, counts in (("active", active), ("pending", pending)):
            for account, n in counts.items():
                key = (self._account(account), state)
                totals[key] = totals.get(key, 0) + n
        for (account, state), n in totals.items():
            self.account_sessions.labels(account=account, state=state).set(n)

    def refused(self, account: str, quota: str) -> None:
        self.account_refusals.labels(account=self._account(account), quota=quota).inc()
        self.rejections.labels(reason="quota").inc()

    def account_chars(self, account: str, chars: int) -> None:
        self.account_characters.labels(account=self._account(account)).inc(chars)

    def set_prompts(self, prompt_tokens: int, prefilled_tokens: int, extra: dict[str, float]) -> None:
        """Bring the prompt and prefix-cache figures up to the engine's."""
        now = (prompt_tokens, prefilled_tokens, *(int(extra.get(f"prefix_cache_{k}", 0))
                                                  for k in ("evictions", "hits", "misses")))
        counters = (self.prompt_tokens, self.prefilled_tokens, self.prefix_evictions,
                    self.prefix_lookups.labels(result="hit"), self.prefix_lookups.labels(result="miss"))
        for counter, new, old in zip(counters, now, self._engine_seen, strict=True):
            if new > old:
                counter.inc(new - old)
        self._engine_seen = now
        if "prefix_cache_bytes" in extra:
            self.prefix_bytes.set(extra["prefix_cache_bytes"])
            self.prefix_entries.set(extra["prefix_cache_entries"])

    def set_lanes(self, live: int, batch: int) -> None:
        self.lane_sessions.labels(lane="live").set(live)
        self.lane_sessions.labels(lane="batch").set(batch)

    def set_batch(self, load: Mapping[str, float]) -> None:
        """Batch items queued and running, and the oldest queued one's age (:meth:`BatchStore.load`)."""
        self.batch_items.labels(state="queued").set(load["queued"])
        self.batch_items.labels(state="running").set(load["running"])
        self.batch_oldest.set(load["oldest_s"])

    def batch_done(self, outcome: str, n: int = 1, audio_s: float = 0.0, evictions: int = 0) -> None:
        self.batch_finished.labels(outcome=outcome).inc(n)
        self.batch_audio.inc(audio_s)
        self.batch_evictions.inc(evictions)

    def set_engine(self, extra: dict[str, float]) -> None:
        """Backend statistics (the TensorRT-LLM executor's latest iteration); absent keys leave gauges
        alone. The executor's gauges exist only once it has reported: the PyTorch backend has none."""
        if "iter_latency_ms" not in extra and self._executor is None:
            return
        if self._executor is None:
            self._executor = _ExecutorGauges(self.registry)
        g = self._executor
        if "iter_latency_ms" in extra:
            g.iteration_ms.set(extra["iter_latency_ms"])
        if "queued_requests" in extra:
            g.engine_queued.set(extra["queued_requests"])
        for state in ("used", "free", "max"):
            if f"kv_blocks_{state}" in extra:
                g.kv_blocks.labels(state=state).set(extra[f"kv_blocks_{state}"])

    def set_codec(self, counters) -> None:
        """Bring the codec counters up to ``counters`` (a :class:`lyre.codec.base.CodecCounters`)."""
        now = (counters.frames_decoded, counters.frames_emitted, counters.decode_s)
        for counter, new, old in zip((self.codec_decoded, self.codec_emitted, self.codec_seconds), now,
                                     self._codec_seen, strict=True):
            if new > old:
                counter.inc(new - old)
        self._codec_seen = now

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
