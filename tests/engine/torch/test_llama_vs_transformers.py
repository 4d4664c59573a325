"""Numerical truth: the engine's greedy tokens and every step's logits equal transformers'
LlamaForCausalLM on the same checkpoint, for many requests joining and leaving at different steps."""

from __future__ import annotations

import pytest
import torch

from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.model import orpheus
from tests.support.engines import drive, logits_of, make_engine, tokens_of

transformers = pytest.importorskip("transformers")

GREEDY_FULL = SamplingParams(temperature=0.0, repetition_penalty=1.0, max_tokens=12, constrain_audio=False,
                             stop_ids=())


def reference_logits(hf, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """transformers' logits for each generated position (teacher forcing): (len(tokens), vocab)."""
    with torch.inference_mode():
        out = hf(torch.tensor([prompt + tokens])).logits[0]
    return out[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]


@pytest.mark.parametrize("shape", ["demo", "gqa4-untied", "mha-llama3"])
def test_staggered_requests_match_transformers(shape, shape_dirs):
    model_dir = shape_dirs[shape]
    hf = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = hf.config.vocab_size
    # Fewer slots than requests (refused adds retried as slots free, slot reuse), a batch smaller than
    # the active set, and a prefill budget that splits the long prompts into chunks.
    engine = make_engine(model_dir, slots=4, max_batch_size=3, max_prefill_tokens=16, max_seq_len=96)
    gen = torch.Generator().manual_seed(0)
    lengths = [3, 40, 7, 1, 23, 11, 31, 5, 17, 2]
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    join_at = [0, 0, 1, 3, 3, 4, 9, 10, 10, 15]
    arrivals: dict[int, list[GenerationRequest]] = {}
    for i, (p, step) in enumerate(zip(prompts, join_at, strict=True)):
        max_tokens = 12 if i % 3 else 6  # some leave early
        arrivals.setdefault(step, []).append(
            GenerationRequest(f"r{i}", p, SamplingParams(**{**GREEDY_FULL.__dict__, "max_tokens": max_tokens}),
                              record_logits=True)
        )
    cancelled_after: list[int] = []

    def cancel_midway(step, deltas):
        got = [t for d in deltas if d.request_id == "r4" for t in d.token_ids]
        if got and not cancelled_after:
            cancelled_after.append(step)
        if cancelled_after and step == cancelled_after[0] + 2:
            engine.cancel("r4")

    out = drive(engine, arrivals, cancel_midway)
    assert out["r4"][-1].finish_reason == "cancelled"
    assert 0 < len(tokens_of(out["r4"])) < 12
    for i, prompt in enumerate(prompts):
        deltas = out[f"r{i}"]
        tokens = tokens_of(deltas)
        if i != 4:
            assert deltas[-1].finish_reason == "length" and len(tokens) == (12 if i % 3 else 6)
        ref = reference_logits(hf, prompt, tokens)
        ours = logits_of(deltas)
        assert ours.shape == ref.shape
        assert (ours - ref).abs().max().item() < 1e-4, f"r{i}"
        assert ref.argmax(-1).tolist() == tokens, f"r{i}"
    stats = engine.stats()
    assert (stats.active, stats.waiting, stats.total_requests) == (0, 0, len(prompts))


def test_constrained_rows_are_transformers_logits_of_the_frame_slot(demo_dir):
    model_dir = demo_dir / "llama"
    hf = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = make_engine(model_dir)
    params = SamplingParams(temperature=0.0, repetition_penalty=1.0, max_tokens=16, stop_ids=())
    prompts = [[orpheus.START_OF_HUMAN, orpheus.BOS, 300 + i, 400, *orpheus.PROMPT_SUFFIX] for i in range(3)]
    arrivals = {i: [GenerationRequest(f"c{i}", p, params, record_logits=True)] for i, p in enumerate(prompts)}
    out = drive(engine, arrivals)
    for i, prompt in enumerate(prompts):
        deltas = out[f"c{i}"]
        tokens = tokens_of(deltas)
        ref = reference_logits(hf, prompt, tokens)  # (n, vocab)
        for k, d in enumerate(deltas):
            ids = d.logits_ids[0]
            band = ids[: orpheus.CODEBOOK_SIZE]
            assert band[0].item() == orpheus.AUDIO_TOKEN_OFFSET + (k % 7) * orpheus.CODEBOOK_SIZE
            assert ids[-1].item() == orpheus.END_OF_SPEECH
            ours = d.logits[0]
            assert (ours[:-1] - ref[k, band]).abs().max().item() < 1e-4
            if k % 7 == 0:
                assert abs(ours[-1].item() - ref[k, orpheus.END_OF_SPEECH].item()) < 1e-4
            else:
                assert ours[-1].item() == float("-inf")
            masked = torch.full_like(ref[k], float("-inf"))
            allowed = ids if k % 7 == 0 else band
            masked[allowed] = ref[k, allowed]
            assert tokens[k] == masked.argmax().item()
        assert orpheus.AudioTokenParser().feed(tokens) and len(tokens) == 16
