"""Model shapes beyond the demo, an engine on a checkpoint, and a loop that drives an engine."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from lyre.engine.base import GenerationRequest, TokenDelta
from lyre.engine.torch.engine import TorchEngine, TorchEngineConfig
from lyre.model import demo

# Beyond the demo (GQA 3, llama3 RoPE, tied): untied + GQA 4 + explicit head_dim != hidden/heads +
# no RoPE scaling; and multi-head (no GQA) + llama3 scaling with other factors + untied.
SHAPE_GQA4_UNTIED = {
    **demo.DEMO_LLAMA_CONFIG,
    "vocab_size": 1000,
    "hidden_size": 96,
    "intermediate_size": 200,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


SHAPE_MHA_LLAMA3 = {
    **demo.DEMO_LLAMA_CONFIG,
    "vocab_size": 700,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "rope_theta": 50000.0,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 2.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 64, "rope_type": "llama3"},
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def make_engine(model_dir: Path, **overrides) -> TorchEngine:
    cfg = TorchEngineConfig(**{"slots": 8, "max_batch_size": 8, "max_seq_len": 256, "max_prefill_tokens": 64,
                               **overrides})
    return TorchEngine.from_checkpoint(model_dir, cfg)


def drive(
    engine: TorchEngine,
    arrivals: dict[int, list[GenerationRequest]],
    on_step: Callable[[int, list[TokenDelta]], None] | None = None,
    max_steps: int = 10_000,
) -> dict[str, list[TokenDelta]]:
    """Step ``engine`` until idle, adding ``arrivals[step]`` before each step (a request that finds
    every slot held is added again before each later step until it gets one); deltas per request."""
    out: dict[str, list[TokenDelta]] = {}
    waiting: deque[GenerationRequest] = deque()
    step = 0
    while (step <= max(arrivals, default=0) or waiting or engine.has_work()) and step < max_steps:
        waiting.extend(arrivals.get(step, []))
        while waiting and engine.add(waiting[0]):
            waiting.popleft()
        deltas = engine.step()
        for d in deltas:
            out.setdefault(d.request_id, []).append(d)
        if on_step:
            on_step(step, deltas)
        step += 1
    assert step < max_steps, "engine did not finish"
    return out


def tokens_of(deltas: list[TokenDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def logits_of(deltas: list[TokenDelta]) -> torch.Tensor:
    return torch.cat([d.logits for d in deltas if d.logits is not None])


def poison(monkeypatch: pytest.MonkeyPatch, engine: TorchEngine, stage: str, request_id: str, after: int = 0) -> None:
    """Fault injection: wrap the engine's real method so that it raises only when ``request_id``
    takes part — its prompt chunk in the forward ("prefill"), its decode row in the forward
    ("decode"), its row in the sampler ("sampling"); the last two once it has ``after`` tokens."""
    fault = RuntimeError(f"simulated {stage} fault")

    def poisoned(seq) -> bool:
        if seq is None or seq.request.request_id != request_id:
            return False
        return seq.num_generated == 0 if stage == "prefill" else seq.num_generated >= max(after, 1)

    if stage == "sampling":
        draw_rows = engine.sampler.draw

        def sampling(seqs, *args):
            drawn = draw_rows(seqs, *args)  # it fails after the draw: every row's generator has moved on
            if any(poisoned(s) for s in seqs):
                raise fault
            return drawn

        monkeypatch.setattr(engine.sampler, "draw", sampling)
        return
    assert stage in ("prefill", "decode"), stage
    if engine.on_device is not None and stage in ("decode", "prefill"):  # audio rows and whole prompts run there
        name = {"decode": "audio", "prefill": "prefill"}[stage]
        monkeypatch.setattr(engine.on_device, name, _PoisonedStep(getattr(engine.on_device, name), poisoned, fault))
        return
    forward = engine.model.forward

    def forward_pass(batch, cache):
        seq = engine.slots.by_id.get(request_id)
        if poisoned(seq) and bool((batch.slots == seq.slot).any()):
            raise fault
        return forward(batch, cache)

    monkeypatch.setattr(engine.model, "forward", forward_pass)



class _PoisonedStep:
    """An engine's on-device step (audio rows, whole prompts) that raises when a poisoned sequence takes part."""

    def __init__(self, step, poisoned: Callable, fault: Exception):
        self.step, self.poisoned, self.fault = step, poisoned, fault

    def __call__(self, seqs):
        if any(self.poisoned(s) for s in seqs):
            raise self.fault
        return self.step(seqs)

    def __getattr__(self, name):
        return getattr(self.step, name)


TORCH_THREADS = torch.get_num_threads()  # the process's default, read when the tests are collected


@contextlib.contextmanager
def all_torch_threads():
    """torch on every core inside (the engine and codec tests' conftests hold it per module): a Lyre
    service started in this process before them (a shared test server, a library test) leaves
    torch's process-wide intra-op pool at the engine's share, and these tests compute on the CPU
    with no service beside them (about 1.6x faster on 2 cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(TORCH_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)
