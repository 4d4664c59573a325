"""Batched sampling in torch: repetition penalty, temperature, top-k, top-p, per-request seeds.

Every row carries its own parameters and its own ``torch.Generator``, so a seeded request draws
the same tokens alone or inside any batch.

Nothing here reads the device: which path a row takes is decided from its parameters on the host,
and its random numbers are drawn on the host (``ROUNDS + 1`` per row per step, used or not, so a
row's stream of draws never depends on its neighbours) and uploaded with the parameters in one
copy. :func:`draw` returns the chosen columns still on the device; the caller reads them back
once per step (with every other row's) and :meth:`Draw.finish` completes the rare rows left.

A row with a top-k samples among its k most likely columns only: one top-k pass over the
vocabulary, then softmax, nucleus and draw over (B, k) values.

Top-p without sorting (rows without a top-k): a token is in the nucleus iff the probability mass of
the tokens strictly more likely than it is below ``top_p`` (the sorted-prefix definition, up to
exact ties). Each row draws ``ROUNDS`` candidates from the whole distribution by inverse CDF (in two
levels: 1024-column blocks, then inside the block drawn) and takes the first one in
the nucleus: accepted draws follow the renormalised nucleus distribution exactly, and each
candidate is in it with probability >= top_p. That mass is monotone in a candidate's probability,
so the nucleus members among a row's candidates are its most likely ones, found by a binary
search in ``ceil(log2(ROUNDS + 1))`` passes over the vocabulary. A row none of whose candidates
is in the nucleus (probability <= (1 - top_p)^ROUNDS: 1.3e-5 at Orpheus's top_p 0.8) is left as
-1 and sampled by sorting in :meth:`Draw.finish`, the only case with a second read-back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lyre.engine.torch.transfer import to_host, upload

ROUNDS = 7  # candidates per row per step: 3 passes of the binary search


@dataclass
class SamplingBatch:
    """Per-row parameters, on the host."""

    temperature: list[float]  # 0 = greedy
    top_k: list[int]  # 0 = off
    top_p: list[float]
    generators: list[torch.Generator]  # one per row: the request's own randomness


@dataclass
class Draw:
    """:func:`draw`'s result: ``cols`` (B,) on the device, -1 where every candidate was outside
    the nucleus; :meth:`finish` completes those from the values read back."""

    cols: torch.Tensor
    probs: torch.Tensor | None = None  # (N, C) what the fallback samples from: the nucleus rows'
    top_p: torch.Tensor | None = None  # (N,)
    fallback_uniform: torch.Tensor | None = None  # (N,)
    rows: list[int] | None = None  # the batch row of each of those N rows (None: all, in order)

    def finish(self, cols: list[int]) -> list[int]:
        """``cols`` (this draw's read-back) with every -1 sampled by sorting (a second read-back)."""
        missing = [r for r, c in enumerate(cols) if c < 0]
        if not missing:
            return cols
        assert self.probs is not None and self.top_p is not None and self.fallback_uniform is not None
        where = {r: i for i, r in enumerate(self.rows)} if self.rows is not None else None
        rows = upload([where[r] for r in missing] if where else missing, self.probs.device)
        picked = to_host(_sample_sorted(self.probs[rows], self.top_p[rows], self.fallback_uniform[rows]))
        out = list(cols)
        for r, c in zip(missing, picked, strict=True):
            out[r] = c
        return out


def apply_repetition_penalty(
    logits: torch.Tensor, history_cols: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """Penalise, in place, columns seen in ``history_cols`` (B, W; -1 = none): positive logits
    divided by the penalty, negative ones multiplied (each column once, however often it repeats).
    Returns ``logits``."""
    if history_cols.numel() == 0:
        return logits
    valid = history_cols >= 0
    # a -1 entry rewrites a column its row penalises anyway (the same value), or, in a row with no
    # history, column 0 with factor 1: no copy of the row is needed to give -1 somewhere to go
    cols = torch.where(valid, history_cols, history_cols.amax(dim=1, keepdim=True).clamp(min=0))  # (B, W)
    p = torch.where(valid.any(dim=1), penalty, 1.0)[:, None]  # (B, 1)
    seen = logits.gather(1, cols)
    # duplicates write the same value: each column is penalised once, however often it repeats
    return logits.scatter_(1, cols, torch.where(seen > 0, seen / p, seen * p))


def draw(logits: torch.Tensor, params: SamplingBatch) -> Draw:
    """The column chosen for each row of ``logits`` (B, C), left on the device; -inf columns are
    never chosen. No read-back. Greedy rows take the argmax; rows with a top-k sample among their
    k best only (:func:`_draw_top_k`); the others by the nucleus rule over the whole row
    (:func:`_draw_nucleus`). Which way a row goes depends on its own parameters only."""
    n, c = logits.shape
    device = logits.device
    greedy = [t <= 0 for t in params.temperature]
    if all(greedy):
        return Draw(logits.argmax(dim=-1))
    no_draws = torch.zeros(ROUNDS + 1)
    host = torch.cat([
        torch.tensor([[1.0 if g else t, p, float(k)]
                      for t, p, k, g in zip(params.temperature, params.top_p, params.top_k, greedy, strict=True)]),
        torch.stack([no_draws if g else torch.rand(ROUNDS + 1, generator=gen)
                     for g, gen in zip(greedy, params.generators, strict=True)]),
    ], dim=1)  # (B, 3 + ROUNDS + 1)
    packed = upload(host, device)
    temperature, top_p, top_k, uniform = packed[:, 0], packed[:, 1], packed[:, 2].long(), packed[:, 3:]
    cols = logits.argmax(dim=-1) if any(greedy) else torch.empty(n, dtype=torch.long, device=device)
    out = Draw(cols)
    top_k_rows = [r for r in range(n) if not greedy[r] and params.top_k[r] > 0]
    nucleus_rows = [r for r in range(n) if not greedy[r] and params.top_k[r] <= 0]
    if top_k_rows:
        k_max = min(max(params.top_k[r] for r in top_k_rows), c)
        sel = _select(top_k_rows, n, device)
        out.cols = _put(out.cols, sel, _draw_top_k(_take(logits, sel), _take(temperature, sel), _take(top_k, sel),
                                                    _take(top_p, sel), _take(uniform, sel)[:, 0], k_max))
    if nucleus_rows:
        sel = _select(nucleus_rows, n, device)
        picked, probs = _draw_nucleus(_take(logits, sel), _take(temperature, sel), _take(top_p, sel),
                                      _take(uniform, sel)[:, :ROUNDS])
        out.cols = _put(out.cols, sel, picked)
        out.probs, out.top_p, out.fallback_uniform = probs, _take(top_p, sel), _take(uniform, sel)[:, ROUNDS]
        out.rows = None if sel is None else nucleus_rows
    return out


def _select(rows: list[int], n: int, device: torch.device) -> torch.Tensor | None:
    """Index of ``rows`` on the device; None when they are the whole batch (no copy then)."""
    return None if len(rows) == n else upload(rows, device)


def _take(t: torch.Tensor, sel: torch.Tensor | None) -> torch.Tensor:
    return t if sel is None else t[sel]


def _put(cols: torch.Tensor, sel: torch.Tensor | None, values: torch.Tensor) -> torch.Tensor:
    return values if sel is None else cols.index_put((sel,), values)


def _draw_top_k(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                uniform: torch.Tensor, k_max: int) -> torch.Tensor:
    """(B,) columns sampled among each row's ``top_k`` most likely (ties at the k-th broken by
    position), then within those by the sorted nucleus rule: one pass over the vocabulary (the
    top-k itself); everything after it is (B, k_max)."""
    values, index = logits.topk(k_max, dim=-1)  # (B, k) most likely first
    beyond = torch.arange(k_max, device=logits.device)[None, :] >= top_k[:, None]
    p = (values / temperature[:, None]).masked_fill(beyond, float("-inf")).softmax(dim=-1)
    p = p * ((p.cumsum(dim=-1) - p) < top_p[:, None])  # the nucleus of the k
    cdf = p.cumsum(dim=-1)
    j = torch.searchsorted(cdf, (uniform[:, None] * cdf[:, -1:]).contiguous(), right=True).clamp_(max=k_max - 1)
    return index.gather(1, j).squeeze(1)


def _draw_nucleus(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, uniform: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) columns by the nucleus rule over whole rows (the module doc), -1 where no candidate was
    in the nucleus; and the probabilities, for the fallback."""
    probs = (logits / temperature[:, None]).softmax(dim=-1)  # (B, C)
    candidates = _inverse_cdf(probs, uniform)  # (B, R)
    accept = _in_nucleus(probs, probs.gather(1, candidates), top_p)  # (B, R)
    first = accept.int().argmax(dim=1, keepdim=True)  # the first accepted candidate
    return torch.where(accept.any(dim=1), candidates.gather(1, first).squeeze(1), -1), probs


BLOCK = 1024  # columns per block of the two-level inverse CDF


def _inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """(B, R) columns drawn from each row of ``probs`` (B, C) by inverse CDF at ``uniform`` (B, R),
    in two levels: the mass of each 1024-column block (one summing pass over the row, where a
    cumulative sum over 157k columns costs 3-4x as much), the block each draw lands in, then the
    cumulative sum inside that block only. Never a zero-probability column."""
    b, c = probs.shape
    whole = c // BLOCK * BLOCK
    sums = probs[:, :whole].reshape(b, -1, BLOCK).sum(dim=-1)  # (B, NB) a view, then one pass
    if whole < c:
        sums = torch.cat([sums, probs[:, whole:].sum(dim=-1, keepdim=True)], dim=1)
    block_cdf = sums.cumsum(dim=-1)  # (B, NB)
    target = uniform * block_cdf[:, -1:]  # (B, R)
    block = torch.searchsorted(block_cdf, target, right=True).clamp_(max=block_cdf.shape[1] - 1)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), 0.0)  # mass of earlier blocks
    offsets = block[..., None] * BLOCK + torch.arange(BLOCK, device=probs.device)  # (B, R, BLOCK)
    inside = probs.gather(1, offsets.clamp(max=c - 1).reshape(b, -1)).reshape(offsets.shape)
    inside = inside.masked_fill(offsets >= c, 0.0)
    cdf = inside.cumsum(dim=-1)  # (B, R, BLOCK)
    j = torch.searchsorted(cdf, (target - before)[..., None], right=True).squeeze(-1)  # (B, R)
    # rounding between the block sums and this sum may step past the block's last likely column
    last = torch.where(inside > 0, torch.arange(BLOCK, device=probs.device), 0).amax(dim=-1)
    return block * BLOCK + torch.minimum(j, last)


def sample(logits: torch.Tensor, params: SamplingBatch) -> list[int]:
    """:func:`draw`, read back and finished: the chosen column of each row."""
    d = draw(logits, params)
    return d.finish(to_host(d.cols))


def _in_nucleus(probs: torch.Tensor, p_cand: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """(B, R) bool: is each candidate (its probability ``p_cand``) in its row's nucleus, i.e. is
    the mass strictly above it < top_p. That mass only falls as p_cand grows, so the members are a
    row's most likely candidates: binary-search how many, over the candidates sorted by probability."""
    rounds = p_cand.shape[1]
    by_p = p_cand.sort(dim=1, descending=True).values  # (B, R)
    lo = torch.zeros(len(p_cand), dtype=torch.long, device=p_cand.device)  # members known
    hi = torch.full_like(lo, rounds)  # members at most
    # reused by each pass; the mask is kept as 0/1 floats: multiplying by a bool mask converts it to
    # floats first, a third pass over the (B, vocab) probabilities (~2x the time of the whole pass)
    above, more_likely = torch.empty_like(probs), torch.empty_like(probs)
    for _ in range(math.ceil(math.log2(rounds + 1))):
        mid = (lo + hi + 1) // 2  # is the mid-th most likely candidate a member?
        x = by_p.gather(1, (mid - 1).clamp(min=0)[:, None])  # (B, 1)
        torch.gt(probs, x, out=more_likely)
        member = torch.mul(probs, more_likely, out=above).sum(dim=-1) < top_p  # (B,) mass above x
        searching = lo < hi
        lo = torch.where(searching & member, mid, lo)
        hi = torch.where(searching & ~member, mid - 1, hi)
    threshold = by_p.gather(1, (lo - 1).clamp(min=0)[:, None])  # (B, 1) the least likely member
    return ((p_cand >= threshold) & (lo > 0)[:, None]) | (top_p >= 1.0)[:, None]


def _sample_sorted(probs: torch.Tensor, top_p: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Top-p by sorting: keep the most likely tokens until their mass reaches top_p."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep = (sorted_probs.cumsum(dim=-1) - sorted_probs) < top_p[:, None]
    sorted_probs = torch.where(keep, sorted_probs, 0.0)
    cdf = sorted_probs.cumsum(dim=-1)
    idx = torch.searchsorted(cdf, uniform[:, None] * cdf[:, -1:], right=True)
    idx = torch.minimum(idx, keep.sum(dim=-1, keepdim=True) - 1)
    return order.gather(1, idx).squeeze(1)
