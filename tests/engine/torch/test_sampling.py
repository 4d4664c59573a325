"""Batched sampling: exact nucleus distribution without sorting, top-k, penalty, greedy, seeds."""

from __future__ import annotations

import torch

from lyre.engine.torch import sampling
from lyre.engine.torch.sampling import SamplingBatch, apply_repetition_penalty, sample


def batch(n, temperature=1.0, top_k=0, top_p=1.0, seed=0) -> SamplingBatch:
    return SamplingBatch(
        temperature=[float(temperature)] * n,
        top_k=[top_k] * n,
        top_p=[float(top_p)] * n,
        generators=[torch.Generator().manual_seed(seed + i) for i in range(n)],
    )


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The textbook definition: sort, keep the prefix whose mass reaches top_p, renormalise."""
    p, order = probs.sort(descending=True)
    keep = (p.cumsum(0) - p) < top_p
    out = torch.zeros_like(probs)
    out[order[keep]] = p[keep]
    return out / out.sum()


def test_top_p_draws_follow_the_exact_nucleus_distribution():
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    expected = nucleus(logits.softmax(0), 0.7)
    n = 4000
    rows = logits.expand(n, -1).contiguous()  # each row its own generator: n independent draws
    cols = sample(rows, batch(n, top_p=0.7))
    freq = torch.bincount(torch.tensor(cols), minlength=8).float() / n
    assert set(cols) <= set(expected.nonzero().squeeze(1).tolist())  # never outside the nucleus
    assert (freq - expected).abs().max() < 0.03  # 4000 draws: ~4 sigma


def test_sorted_fallback_agrees_with_the_textbook_nucleus():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    probs = logits.softmax(-1)
    for _ in range(20):
        u = torch.rand(3)
        cols = sampling._sample_sorted(probs, torch.full((3,), 0.5), u)
        for r in range(3):
            assert nucleus(probs[r], 0.5)[cols[r]] > 0


def test_rows_that_keep_rejecting_fall_back_and_still_land_in_the_nucleus(monkeypatch):
    # every candidate rejected: the sorted path (and its second read-back) for every row
    monkeypatch.setattr(sampling, "_in_nucleus", lambda probs, p_cand, top_p: torch.zeros_like(p_cand, dtype=torch.bool))
    logits = torch.randn(64, 30, generator=torch.Generator().manual_seed(2))
    cols = sample(logits, batch(64, top_p=0.3))
    for r in range(64):
        assert nucleus(logits[r].softmax(0), 0.3)[cols[r]] > 0


def test_top_k_and_temperature_and_greedy_rows_in_one_batch():
    logits = torch.tensor([[0.0, 3.0, 2.9, 2.8, -1.0]] * 3)
    params = batch(3, top_k=2)
    params.temperature = [0.0, 1.0, 50.0]  # greedy, normal, nearly flat
    for seed in range(30):
        params.generators = [torch.Generator().manual_seed(seed * 3 + i) for i in range(3)]
        cols = sample(logits, params)
        assert cols[0] == 1  # greedy
        assert cols[1] in (1, 2) and cols[2] in (1, 2)  # top-2 only, whatever the temperature


def test_minus_infinity_columns_are_never_chosen():
    logits = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]] * 200)
    cols = sample(logits, batch(200, top_p=1.0))
    assert set(cols) == {0, 2}


def test_same_generator_state_gives_the_same_draw_whatever_the_neighbours():
    logits = torch.randn(5, 100, generator=torch.Generator().manual_seed(3))
    alone = sample(logits[2:3], batch(1, top_p=0.8, seed=42))
    params = batch(5, top_p=0.8, seed=0)
    params.generators[2] = torch.Generator().manual_seed(42)
    assert sample(logits, params)[2] == alone[0]


def test_repetition_penalty_hits_seen_columns_once():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5], [2.0, -2.0, 1.0, 0.5], [2.0, -2.0, 1.0, 0.5]])
    history = torch.tensor([[0, 1, 1, -1, 0], [-1, -1, -1, -1, -1], [3, -1, -1, -1, -1]])  # (-1: none)
    out = apply_repetition_penalty(logits, history, torch.tensor([2.0, 2.0, 2.0]))
    assert out.tolist() == [[1.0, -4.0, 1.0, 0.5], [2.0, -2.0, 1.0, 0.5], [2.0, -2.0, 1.0, 0.25]]
    assert out is logits  # (in place: the step's own logits)
    assert apply_repetition_penalty(logits, torch.empty(3, 0, dtype=torch.long), torch.tensor([2.0] * 3)) is logits


def test_the_nucleus_search_agrees_with_the_mass_of_every_candidate():
    """The binary search over candidates sorted by probability gives the same members as summing,
    for each candidate, the mass strictly above it (ties and top_p >= 1 included)."""
    g = torch.Generator().manual_seed(5)
    for trial in range(50):
        probs = (torch.randn(6, 40, generator=g) * (trial % 4 + 0.5)).softmax(-1)
        if trial % 5 == 0:
            probs[:, :8] = probs[:, :1]  # ties
            probs = probs / probs.sum(-1, keepdim=True)
        candidates = torch.randint(0, 40, (6, sampling.ROUNDS), generator=g)
        p_cand = probs.gather(1, candidates)
        top_p = torch.tensor([0.05, 0.3, 0.5, 0.8, 0.95, 1.0])
        mass_above = torch.stack([(probs * (probs > p_cand[:, r : r + 1])).sum(-1) for r in range(sampling.ROUNDS)], 1)
        expected = (mass_above < top_p[:, None]) | (top_p >= 1.0)[:, None]
        assert torch.equal(sampling._in_nucleus(probs, p_cand, top_p), expected), trial


def test_two_level_inverse_cdf_follows_the_distribution_across_blocks_and_the_tail():
    """More columns than one block, and not a multiple of it: the draws land where the mass is,
    in the tail block too, and never on a zero-probability column."""
    c = 2 * sampling.BLOCK + 300
    probs = torch.zeros(c)
    likely = [5, 1023, 1024, 2047, 2048 + 17, c - 1]  # block edges and the tail
    probs[likely] = torch.tensor([0.1, 0.15, 0.2, 0.05, 0.3, 0.2])
    n = 4000
    u = torch.rand(n, sampling.ROUNDS, generator=torch.Generator().manual_seed(7))
    cols = sampling._inverse_cdf(probs.expand(n, -1).contiguous(), u).reshape(-1)
    assert set(cols.tolist()) <= set(likely)
    freq = torch.bincount(cols, minlength=c).float()[likely] / cols.numel()
    assert (freq - probs[likely]).abs().max() < 0.02


def test_top_k_rows_sample_the_nucleus_of_their_k_best():
    logits = torch.tensor([3.0, 2.5, 2.0, 1.8, 1.0, 0.5, 0.0, -1.0] * 40)  # 320 columns, repeats tie
    logits = logits + torch.arange(320) * 1e-4  # (ties broken: the later copy is more likely)
    p, order = logits.softmax(0).sort(descending=True)
    top = torch.zeros(320)
    top[order[:6]] = p[:6]
    expected = nucleus(top / top.sum(), 0.6)
    n = 4000
    cols = sample(logits.expand(n, -1).contiguous(), batch(n, top_k=6, top_p=0.6))
    freq = torch.bincount(torch.tensor(cols), minlength=320).float() / n
    assert set(cols) <= set(expected.nonzero().squeeze(1).tolist())
    assert (freq - expected).abs().max() < 0.03


def test_a_rows_draw_does_not_depend_on_which_way_its_neighbours_sample():
    logits = torch.randn(4, 3000, generator=torch.Generator().manual_seed(9))
    for top_k in (0, 50):
        alone = sample(logits[1:2], SamplingBatch([0.7], [top_k], [0.8], [torch.Generator().manual_seed(11)]))
        mixed = SamplingBatch([0.0, 0.7, 1.0, 0.9], [0, top_k, 50 - top_k, 7], [1.0, 0.8, 0.9, 0.5],
                              [torch.Generator().manual_seed(s) for s in (1, 11, 2, 3)])
        assert sample(logits, mixed)[1] == alone[0]
