"""The counter-based draws of on-device sampling (``lyre.engine.torch.row_sampling.draw_bits``): uniform,
a function of (seed, counter) only, different across seeds; drawn through ``sample_rows`` they give
each code its probability."""

from __future__ import annotations

import numpy as np
import torch

from lyre.engine.torch.row_sampling import draw_bits, sample_rows, uniform


def uniforms(seeds, counters, stream: int = 0) -> torch.Tensor:
    return uniform(torch.from_numpy(draw_bits(np.asarray(seeds), np.asarray(counters), stream)))


def test_draws_are_uniform_in_the_unit_interval_over_counters_and_over_seeds():
    n = 200_000
    for u in (uniforms(np.full(n, 12345), np.arange(n)),  # one row's steps
              uniforms(np.arange(n) * 7919, np.zeros(n, dtype=np.int64))):  # many rows' first steps
        assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
        ecdf = torch.sort(u).values
        assert float((ecdf - (torch.arange(n) + 0.5) / n).abs().max()) < 0.005  # Kolmogorov-Smirnov: p ~ 1e-4
        assert abs(float(u.mean()) - 0.5) < 0.003
        assert abs(float(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1])) < 0.01  # neighbours unrelated


def test_a_draw_depends_on_its_seed_and_counter_only():
    seeds = np.array([0, 1, 2**63 - 1, 2**32, 2**32 + 1, 42])
    counters = np.array([0, 5, 999_999, 3, 3, 7])
    together = uniforms(seeds, counters)
    alone = torch.cat([uniforms(seeds[i:i + 1], counters[i:i + 1]) for i in range(len(seeds))])
    assert torch.equal(together, alone)
    assert len(set(together.tolist())) == len(seeds)  # (seeds 2**32 and 2**32 + 1 differ in the low word only)
    assert not torch.equal(uniforms(seeds, counters, stream=1), together)


def test_draws_through_the_row_rule_give_each_code_its_probability():
    """A row sampled at 40,000 successive counters of one seed: each code's share is its probability
    within the nucleus (top_p 0.9 here keeps the codes whose mass above is under 0.9)."""
    logits = torch.tensor([2.0, 1.0, 0.5, 3.0, -1.0, 0.0, -2.0])
    n = 40_000
    cols = sample_rows(logits.expand(n, -1), torch.ones(n), torch.zeros(n, dtype=torch.long),
                       torch.full((n,), 0.9), uniforms(np.full(n, 77), np.arange(n)))
    probs = logits.softmax(-1)
    order = probs.argsort(descending=True)
    above = torch.cumsum(probs[order], 0) - probs[order]
    nucleus = order[above < 0.9]
    want = torch.zeros(7)
    want[nucleus] = probs[nucleus] / probs[nucleus].sum()
    got = torch.bincount(cols, minlength=7).float() / n
    assert torch.allclose(got, want, atol=0.008), (got, want)
    assert set(cols.tolist()) == set(nucleus.tolist())
