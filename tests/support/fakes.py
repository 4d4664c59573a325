"""Test doubles, named as such: they stand in for what the scheduler tests do not exercise.

- ``FakeClock``: time that moves only when the test says so.
- ``FakeTokenEngine``: the ``TokenEngine`` contract with scripted tokens instead of a model
  (stands in for a GPU engine so that scheduling decisions are the only thing under test).
- ``SilentSnac``: a SNAC whose ``decode`` returns silence of the right length instead of running
  the network (for the window codec, when only scheduling is under test).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from lyre.engine.base import EngineStats, GenerationRequest, TokenDelta
from lyre.model import orpheus


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class _FakeSeq:
    request: GenerationRequest
    order: int
    generated: int = 0
    cancelled: bool = False


@dataclass
class FakeTokenEngine:
    capacity: int = 4
    max_batch_size: int = 2
    tokens_per_request: int = 70  # then end-of-speech
    fail_request: str | None = None  # this request id gets an error delta at its first step
    chosen_log: list[list[str]] = field(default_factory=list)  # request ids decoded, per step
    _active: list[_FakeSeq] = field(default_factory=list)  # admission order
    _n: int = 0
    total_tokens: int = 0
    steps: int = 0

    def add(self, request: GenerationRequest) -> bool:
        if any(s.request.request_id == request.request_id for s in self._active):
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        if len(self._active) >= self.capacity:
            return False
        self._n += 1
        self._active.append(_FakeSeq(request, self._n))
        return True

    def cancel(self, request_id: str) -> None:
        for s in self._active:
            if s.request.request_id == request_id:
                s.cancelled = True

    def kept_prefixes(self) -> list[str]:
        return []

    def forget_prefix(self, name: str) -> None:
        pass

    def has_work(self) -> bool:
        return bool(self._active)

    def stats(self) -> EngineStats:
        return EngineStats(self.capacity, len(self._active), 0, 0, self._n, self.total_tokens, self.steps, 0)

    def step(self, order: Sequence[str] | None = None) -> list[TokenDelta]:
        deltas = []
        for s in [s for s in self._active if s.cancelled]:
            self._active.remove(s)
            deltas.append(TokenDelta(s.request.request_id, [], True, "cancelled"))
        by_id = {s.request.request_id: s for s in self._active}  # every one is ready (no prefill here)
        wanted = list(by_id) if order is None else dict.fromkeys(order)
        chosen = [by_id[rid] for rid in wanted if rid in by_id][: self.max_batch_size]
        self.chosen_log.append([s.request.request_id for s in chosen])
        self.steps += 1
        for s in chosen:
            rid = s.request.request_id
            if rid == self.fail_request:
                self._active.remove(s)
                deltas.append(TokenDelta(rid, [], True, "error", error="RuntimeError: simulated device fault"))
                continue
            k = s.generated
            s.generated += 1
            self.total_tokens += 1
            if k >= self.tokens_per_request:
                self._active.remove(s)
                deltas.append(TokenDelta(rid, [orpheus.END_OF_SPEECH], True, "stop"))
            else:
                deltas.append(TokenDelta(rid, [orpheus.audio_token_id((k * 37) % 4096, k)]))
        return deltas


class SilentSnac:
    calls = 0

    def decode(self, codes):
        self.calls += 1
        b, t = codes[0].shape
        return torch.zeros(b, 1, t * orpheus.SAMPLES_PER_FRAME)


def silent_pipeline(settings=None, overlap: bool = False):
    """An :class:`AudioPipeline` over the window codec with a silent SNAC."""
    from lyre.codec import StreamSettings, WindowCodec
    from lyre.core.pipeline import AudioPipeline

    return AudioPipeline(WindowCodec(SilentSnac()), settings or StreamSettings(warmup_frames=1), overlap=overlap)
