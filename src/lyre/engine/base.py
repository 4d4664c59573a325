"""The ``TokenEngine`` contract shared by every backend (DESIGN.md section 2).

An engine owns the model and its KV cache and is driven by one thread. It never calls back into
its caller: ``add(request)`` puts a generation into a free KV slot at once or returns False (no slot
free; nothing is queued, the caller keeps the request and tries again after a step),
``cancel(request_id)`` ends one, and each ``step(order)`` runs one iteration, decoding the ready
requests in the caller's order, and returns the new token ids per request as :class:`TokenDelta`.
A request finishes with ``finish_reason`` stop | length | cancelled | error, and its slot is free
for the next step.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import ValidationError

from lyre.config import SamplingConfig
from lyre.config.validation import request_error
from lyre.model import orpheus

if TYPE_CHECKING:
    import torch

# stop: a stop id (end of speech); length: max_tokens or a full slot; repetition: a runaway's guard (Qwen3-TTS)
FinishReason = Literal["stop", "length", "repetition", "cancelled", "error"]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.6  # 0 = greedy
    top_p: float = 0.8
    top_k: int = 0  # 0 = off
    repetition_penalty: float = 1.1  # 1.0 = off
    repetition_window: int = 64  # most recent generated tokens penalised; 0 = all
    max_tokens: int = 1200
    min_tokens: int = 0  # stop ids are masked until this many tokens have been generated
    seed: int | None = None  # per request: the same seed gives the same tokens, whatever the batch
    stop_ids: tuple[int, ...] = orpheus.STOP_IDS
    constrain_audio: bool = True  # after start-of-speech only codes valid for the frame slot

    @classmethod
    def from_config(cls, cfg: SamplingConfig, **overrides: Any) -> SamplingParams:
        base = cls(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            repetition_penalty=cfg.repetition_penalty,
            repetition_window=cfg.repetition_window,
            max_tokens=cfg.max_tokens,
            min_tokens=cfg.min_tokens,
            seed=cfg.seed,
            constrain_audio=cfg.constrain_audio,
        )
        return replace(base, **overrides)

    def validate(self) -> None:
        """Raise ValueError (an InvalidRequest) naming the first unacceptable field: the limits the
        config's ``sampling`` section declares, whoever built these parameters."""
        try:
            SamplingConfig.model_validate({name: getattr(self, name) for name in SamplingConfig.model_fields})
        except ValidationError as e:
            raise request_error(SamplingConfig, e.errors(include_url=False)[0]) from None


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # higher is served first (new sessions before their first audio); negative: a batch item, whose prefill
    # (like its decoding) runs only in steps whose ``order`` lists it (the PyTorch engine; TensorRT-LLM's
    # executor gets the lowest priority)
    priority: int = 0
    record_logits: bool = False  # debugging/tests: attach each step's logits to the delta
    # The first ``prefix_len`` prompt ids are shared by many requests (a cloned voice's reference
    # turn) under this name: an engine may keep their K/V and reuse it (results are the same).
    prefix_key: str | None = None
    prefix_len: int = 0

    @property
    def prompt_len(self) -> int:
        """Prompt positions: one per id (a family whose prompt is rows says how many rows)."""
        return len(self.prompt_ids)

    @property
    def prefix_ids(self) -> tuple:
        """What the shared prefix is made of (a kept prefix serves only a request whose prefix is this)."""
        return tuple(self.prompt_ids[: self.prefix_len])


@dataclass
class TokenDelta:
    request_id: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    # With record_logits: one row per token in token_ids. Shape (n, vocab), or (n, 4097) when
    # constrained: the 4096 codes of the frame slot then end-of-speech (see logits_ids).
    logits: torch.Tensor | None = None
    logits_ids: torch.Tensor | None = None  # (n, C) token id of each logits column


@dataclass
class EngineStats:
    capacity: int  # KV slots
    active: int  # requests holding a slot
    waiting: int  # accepted requests not yet running (inside TensorRT-LLM's executor); always 0 for torch
    prefilling: int  # active requests whose prompt is not fully in the cache yet
    total_requests: int
    total_tokens: int  # generated tokens
    total_steps: int  # forward passes
    kv_cache_bytes: int
    prompt_tokens: int = 0  # prompt tokens of every request admitted
    prefilled_tokens: int = 0  # of those, the ones run through the model (the rest came from the prefix cache)
    backend: str = "torch"
    extra: dict[str, float] = field(default_factory=dict)  # backend statistics (TensorRT-LLM: iteration stats)


def check_prompt(request: GenerationRequest, vocab_size: int, in_engine: Container[str]) -> None:
    """The checks every backend's ``add`` makes first: a new id, a non-empty prompt inside the vocabulary."""
    if request.request_id in in_engine:
        raise ValueError(f"request id {request.request_id!r} is already in the engine")
    ids = request.prompt_ids
    if not ids:
        raise ValueError("the prompt is empty")
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt id {bad} is outside the model's vocabulary (0..{vocab_size - 1})")


class TokenEngine(Protocol):
    capacity: int  # KV slots: requests that can be in the engine at once

    def add(self, request: GenerationRequest) -> bool:
        """Give ``request`` a free KV slot at once and return True. Return False when every slot is
        held: nothing is queued, the caller keeps the request and tries again after a later step.
        Raise ValueError for a request that can never run (bad ids, prompt too long, duplicate id,
        bad sampling values), whether or not a slot is free."""
        ...

    def cancel(self, request_id: str) -> None:
        """End a request; its ``cancelled`` delta comes at the next step. Unknown ids are ignored."""
        ...

    def step(self, order: Sequence[str] | None = None) -> list[TokenDelta]:
        """One iteration; this step's deltas. ``order``: the request ids allowed to decode this
        step, most urgent first; the first ``max_batch_size`` of them that are ready (prefilled)
        decode. Requests not in ``order`` do not decode, but every admitted request still
        prefilling goes on prefilling (priority, then admission order, within the prefill budget;
        a negative-priority request only when it is in ``order``), and one whose prefill completes
        samples its first token. Unknown ids are ignored.
        ``None``: every ready request, earliest admitted first (up to ``max_batch_size``)."""
        ...

    def kept_prefixes(self) -> list[str]:
        """The ``prefix_key`` s whose K/V is kept."""
        ...

    def forget_prefix(self, name: str) -> None:
        """Drop every kept prefix whose ``prefix_key`` starts with ``name`` (a deleted voice)."""
        ...

    def has_work(self) -> bool: ...

    def stats(self) -> EngineStats: ...
