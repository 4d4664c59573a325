"""Batched sampling in torch: repetition penalty, temperature, top-k, top-p, per-request seeds.

Every row carries its own parameters and its own ``torch.Generator``, so a seeded request draws
the same tokens alone or inside any batch.

Nothing here reads the device: which path a row takes is decided from its parameters on the host,
and its random numbers are drawn on the host (``ROUNDS + 1`` per row per step, used or not, so a
row's stream of draws never depends on its neighbours) and uploaded with the parameters in one
copy. :func:`draw` returns the chosen columns still on the device; the caller reads them back
once per step (with every other row's) and :meth:`Draw.finish` completes the rare rows left.

Top-p without sorting: a token is in the nucleus iff the probability mass of the tokens strictly
more likely than it is below ``top_p`` (the sorted-prefix definition, up to exact ties). Each row
draws ``ROUNDS`` candidates from the whole distribution by inverse CDF and takes the first one in
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
import torch.nn.functional as F

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
    probs: torch.Tensor | None = None  # (B, C) what the fallback samples from
    top_p: torch.Tensor | None = None  # (B,)
    fallback_uniform: torch.Tensor | None = None  # (B,)

    def finish(self, cols: list[int]) -> list[int]:
        """``cols`` (this draw's read-back) with every -1 sampled by sorting (a second read-back)."""
        missing = [r for r, c in enumerate(cols) if c < 0]
        if not missing:
            return cols
        assert self.probs is not None and self.top_p is not None and self.fallback_uniform is not None
        rows = upload(missing, self.probs.device)
        picked = to_host(_sample_sorted(self.probs[rows], self.top_p[rows], self.fallback_uniform[rows]))
        out = list(cols)
        for r, c in zip(missing, picked, strict=True):
            out[r] = c
        return out


def apply_repetition_penalty(
    logits: torch.Tensor, history_cols: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """Penalise columns seen in ``history_cols`` (B, W; -1 = none): positive logits divided by
    the penalty, negative ones multiplied (each column once, however often it repeats)."""
    if history_cols.numel() == 0:
        return logits
    c = logits.shape[1]
    padded = F.pad(logits, (0, 1))  # (B, C + 1): -1 entries point at the spill column C
    cols = torch.where(history_cols < 0, c, history_cols)  # (B, W)
    seen = padded.gather(1, cols)
    p = penalty[:, None]
    # duplicates write the same value: each column is penalised once, however often it repeats
    padded.scatter_(1, cols, torch.where(seen > 0, seen / p, seen * p))
    return padded[:, :c]


def draw(logits: torch.Tensor, params: SamplingBatch) -> Draw:
    """The column chosen for each row of ``logits`` (B, C), left on the device; -inf columns are
    never chosen. No read-back."""
    n, c = logits.shape
    device = logits.device
    greedy = [t <= 0 for t in params.temperature]
    if all(greedy):
        return Draw(logits.argmax(dim=-1))
    no_draws = torch.zeros(ROUNDS + 1)
    host = torch.cat([
        torch.tensor([[1.0 if g else t, p, float(k), float(g)]
                      for t, p, k, g in zip(params.temperature, params.top_p, params.top_k, greedy, strict=True)]),
        torch.stack([no_draws if g else torch.rand(ROUNDS + 1, generator=gen)
                     for g, gen in zip(greedy, params.generators, strict=True)]),
    ], dim=1)  # (B, 4 + ROUNDS + 1)
    packed = upload(host, device)
    temperature, top_p, top_k, is_greedy = packed[:, 0], packed[:, 1], packed[:, 2].long(), packed[:, 3] > 0
    uniform = packed[:, 4:]  # (B, ROUNDS + 1)
    scaled = logits / temperature[:, None]
    if any(k > 0 for k in params.top_k):
        k_max = min(max(params.top_k), c)
        kth = scaled.topk(k_max, dim=-1).values.gather(1, (top_k.clamp(1, k_max) - 1)[:, None])  # (B, 1)
        scaled = scaled.masked_fill((top_k[:, None] > 0) & (scaled < kth), float("-inf"))
    probs = scaled.softmax(dim=-1)  # (B, C)
    cdf = probs.cumsum(dim=-1)
    candidates = torch.searchsorted(cdf, uniform[:, :ROUNDS] * cdf[:, -1:], right=True).clamp_(max=c - 1)  # (B, R)
    accept = _in_nucleus(probs, probs.gather(1, candidates), top_p)  # (B, R)
    first = accept.int().argmax(dim=1, keepdim=True)  # the first accepted candidate
    cols = torch.where(accept.any(dim=1), candidates.gather(1, first).squeeze(1), -1)
    if any(greedy):
        cols = torch.where(is_greedy, logits.argmax(dim=-1), cols)
    return Draw(cols, probs, top_p, uniform[:, ROUNDS])


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
