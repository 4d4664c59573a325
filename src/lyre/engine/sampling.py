"""Batched sampling in torch: repetition penalty, temperature, top-k, top-p, per-request seeds.

Every row carries its own parameters. Randomness comes from one uniform number per row drawn from
that request's own generator, then inverse-CDF sampling over the filtered distribution — so a
seeded request draws the same tokens alone or inside any batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingBatch:
    temperature: torch.Tensor  # (B,) float; 0 = greedy
    top_k: torch.Tensor  # (B,) long; 0 = off
    top_p: torch.Tensor  # (B,) float
    repetition_penalty: torch.Tensor  # (B,) float; 1 = off
    uniform: torch.Tensor  # (B,) float in [0, 1), from each request's generator


def apply_repetition_penalty(
    logits: torch.Tensor, history_cols: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """Penalise columns seen in ``history_cols`` (B, W; -1 = none): positive logits divided by
    the penalty, negative ones multiplied (each column once, however often it repeats)."""
    if history_cols.numel() == 0:
        return logits
    b, c = logits.shape
    seen = torch.zeros(b, c + 1, dtype=torch.bool, device=logits.device)
    cols = torch.where(history_cols < 0, c, history_cols)  # -1 -> a spill column
    seen.scatter_(1, cols, True)
    seen = seen[:, :c]
    p = penalty[:, None]
    penalised = torch.where(logits > 0, logits / p, logits * p)
    return torch.where(seen, penalised, logits)


def sample(logits: torch.Tensor, params: SamplingBatch) -> torch.Tensor:
    """Column index chosen for each row of ``logits`` (B, C); -inf columns are never chosen."""
    greedy = params.temperature <= 0
    choice = logits.argmax(dim=-1)
    if bool(greedy.all()):
        return choice
    temperature = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
    scaled = logits / temperature[:, None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)  # (B, C)
    probs = sorted_logits.softmax(dim=-1)
    rank = torch.arange(logits.shape[1], device=logits.device)[None, :]
    k = torch.where(params.top_k > 0, params.top_k, logits.shape[1])
    keep = rank < k[:, None]
    # top-p: keep the smallest prefix whose mass reaches top_p (the first token always stays)
    mass_before = probs.cumsum(dim=-1) - probs
    keep &= mass_before < params.top_p[:, None]
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    cdf = probs.cumsum(dim=-1)  # (B, C)
    target = params.uniform[:, None] * cdf[:, -1:]
    picked = torch.searchsorted(cdf, target, right=True).clamp_(max=logits.shape[1] - 1)  # (B, 1)
    # never land on a zero-probability column through rounding at the end of the CDF
    picked = torch.minimum(picked, keep.sum(dim=-1, keepdim=True) - 1)
    sampled = order.gather(1, picked).squeeze(1)
    return torch.where(greedy, choice, sampled)
