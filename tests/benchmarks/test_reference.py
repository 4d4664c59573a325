"""The reference step of ``--baseline reference`` (``lyre.benchmarks.reference``) is an honest Llama
decode step: fed a prompt one token at a time, its greedy tokens are the engine's (whole vocabulary,
no penalty) on the same weights, for every sequence of a batch."""

from __future__ import annotations

import torch

from lyre.benchmarks.reference import ReferenceStep
from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.model import orpheus
from tests.support.engines import drive, make_engine, tokens_of


def test_the_reference_steps_greedy_tokens_are_the_engines(demo_dir):
    engine = make_engine(demo_dir / "llama", slots=2, max_batch_size=2)
    prompts = [[orpheus.START_OF_HUMAN, 400, 25, 376], [orpheus.START_OF_HUMAN, 401, 30, 9, 12]]
    greedy = SamplingParams(temperature=0.0, repetition_penalty=1.0, constrain_audio=False, stop_ids=(), max_tokens=6)
    out = drive(engine, {0: [GenerationRequest(f"p{i}", p, greedy) for i, p in enumerate(prompts)]})
    want = [tokens_of(out[f"p{i}"]) for i in range(2)]
    # the reference at batch 2: each row fed its own prompt, then its own tokens, one position a step
    step = ReferenceStep(engine.model, 2, 64, 0, engine.cfg.kv_dtype)
    fed = [list(p) for p in prompts]
    got: list[list[int]] = [[], []]
    with torch.inference_mode():
        for t in range(max(map(len, prompts)) + 6):
            step.tokens.copy_(torch.tensor([f[min(t, len(f) - 1)] for f in fed]))
            step.positions.copy_(torch.tensor([min(t, len(f) - 1) for f in fed]))
            nxt = step().tolist()
            for i, f in enumerate(fed):
                if t == len(f) - 1 and len(got[i]) < 6:  # the row's last fed token: its next one is sampled
                    got[i].append(nxt[i])
                    f.append(nxt[i])
    assert got == want
    assert step.time_ms(steps=2) > 0
