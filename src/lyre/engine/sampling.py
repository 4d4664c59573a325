"""Batched sampling in torch: repetition penalty, temperature, top-k, top-p, per-request seeds.

Every row carries its own parameters and its own ``torch.Generator``, so a seeded request draws
the same tokens alone or inside any batch.

Top-p without sorting: a token is in the nucleus iff the probability mass of the tokens strictly
more likely than it is below ``top_p`` (the sorted-prefix definition, up to exact ties). We draw a
token from the whole distribution by inverse CDF and accept it iff it is in the nucleus, else draw
again: accepted draws follow the renormalised nucleus distribution exactly, and each try succeeds
with probability >= top_p. Rows still unlucky after a few tries fall back to the sorted method.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

CANDIDATES = 1  # draws tested per row per round (measured: more per round costs more than extra rounds)
MAX_ROUNDS = 8


@dataclass
class SamplingBatch:
    temperature: torch.Tensor  # (B,) float; 0 = greedy
    top_k: torch.Tensor  # (B,) long; 0 = off
    top_p: torch.Tensor  # (B,) float
    generators: list[torch.Generator]  # one per row: the request's own randomness

    def uniform(self, rows: list[int], n: int = 1) -> torch.Tensor:
        """(len(rows), n) uniform numbers in [0, 1), each row's from its own generator."""
        values = torch.stack([torch.rand(n, generator=self.generators[r]) for r in rows])
        return values.to(self.temperature.device)


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


def sample(logits: torch.Tensor, params: SamplingBatch) -> torch.Tensor:
    """Column index chosen for each row of ``logits`` (B, C); -inf columns are never chosen."""
    greedy = params.temperature <= 0
    any_greedy = bool(greedy.any())
    choice = logits.argmax(dim=-1) if any_greedy else None
    if any_greedy and bool(greedy.all()):
        return choice
    temperature = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
    scaled = logits / temperature[:, None]
    if bool((params.top_k > 0).any()):
        k = params.top_k.clamp(max=logits.shape[1])
        kth = scaled.topk(int(k.max()), dim=-1).values.gather(1, (k.clamp(min=1) - 1)[:, None])  # (B, 1)
        scaled = scaled.masked_fill((params.top_k[:, None] > 0) & (scaled < kth), float("-inf"))
    probs = scaled.softmax(dim=-1)  # (B, C)
    cdf = probs.cumsum(dim=-1)
    picked = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    pending = [r for r in range(logits.shape[0]) if not greedy[r]]
    for _ in range(MAX_ROUNDS):
        if not pending:
            break
        rows = torch.tensor(pending, device=logits.device)
        everyone = len(pending) == logits.shape[0]
        p_rows, cdf_rows = (probs, cdf) if everyone else (probs[rows], cdf[rows])  # (n, C)
        target = params.uniform(pending, CANDIDATES) * cdf_rows[:, -1:]  # (n, M)
        col = torch.searchsorted(cdf_rows, target, right=True).clamp_(max=logits.shape[1] - 1)  # (n, M)
        p_col = p_rows.gather(1, col)  # (n, M)
        mass_above = torch.where(p_rows[:, None, :] > p_col[:, :, None], p_rows[:, None, :], 0.0).sum(-1)  # (n, M)
        top_p = params.top_p[rows][:, None]
        accept = (mass_above < top_p) | (top_p >= 1.0)  # (n, M)
        done = accept.any(dim=1)
        first = accept.int().argmax(dim=1, keepdim=True)  # first accepted draw
        picked[rows[done]] = col.gather(1, first)[done, 0]
        pending = [r for r, ok in zip(pending, done.tolist(), strict=True) if not ok]
    if pending:
        rows = torch.tensor(pending, device=logits.device)
        picked[rows] = _sample_sorted(probs[rows], params.top_p[rows], params.uniform(pending)[:, 0])
    return torch.where(greedy, choice, picked) if any_greedy else picked


def _sample_sorted(probs: torch.Tensor, top_p: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Top-p by sorting: keep the most likely tokens until their mass reaches top_p."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep = (sorted_probs.cumsum(dim=-1) - sorted_probs) < top_p[:, None]
    sorted_probs = torch.where(keep, sorted_probs, 0.0)
    cdf = sorted_probs.cumsum(dim=-1)
    idx = torch.searchsorted(cdf, uniform[:, None] * cdf[:, -1:], right=True)
    idx = torch.minimum(idx, keep.sum(dim=-1, keepdim=True) - 1)
    return order.gather(1, idx).squeeze(1)
