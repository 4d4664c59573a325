"""Sampling decided on the device, over static shapes, as a CUDA graph needs: each row's temperature
(0 = greedy), top-k (0 = off) and top-p are tensors, and its uniform draw is a tensor too, so one
fixed sequence of operations samples a batch whatever rules its rows follow, and nothing is read back.

:func:`uniforms` makes those draws from a per-row seed and a per-row counter (a counter-based
generator: a hash of the pair), so a row's draws depend on its own seed and position only: the same
alone or beside any rows, on a CPU or a GPU, and without a generator state to carry or restore.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
# odd multipliers below 2**31: a 32-bit value times one stays below 2**63, so int64 arithmetic never overflows
_MULTIPLIERS = (0x7FEB352D, 0x2C1B3C6D, 0x297A2D39)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply rounds) of ``x`` (int64 values in [0, 2**32))."""
    for m in _MULTIPLIERS:
        x = x ^ (x >> 16)
        x = (x * m) & _MASK32
    return x ^ (x >> 15)


def uniforms(seed: torch.Tensor, counter: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """(B,) float32 draws in [0, 1), one per row: a function of the row's ``seed`` (int64, any value),
    ``counter`` (int64 >= 0) and ``stream`` (which draw of the step: 0 for the token) only."""
    lo, hi = seed & _MASK32, (seed >> 32) & _MASK32
    x = _mix((counter & _MASK32) ^ _mix(hi ^ _mix(lo ^ (stream * 0x9E3779B9 & _MASK32))))
    x = _mix(x ^ ((counter >> 32) & _MASK32))
    return (x >> 8).to(torch.float32) * (1.0 / (1 << 24))  # 24 bits: exact in float32, never 1.0


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                uniform: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """(B,) a column per row of ``logits`` (B, V): greedy where temperature is 0, else among its
    ``top_k`` best (0: all), within their ``top_p`` nucleus, by inverse CDF at ``uniform`` (B,).
    ``width``: how many best columns are ranked (at least every row's top_k; default all)."""
    width = width or logits.shape[1]
    values, index = logits.topk(width, dim=-1)  # (B, width) most likely first
    k = torch.where(top_k > 0, top_k, width).clamp(max=width)[:, None]
    greedy = temperature <= 0
    t = torch.where(greedy, 1.0, temperature)[:, None]
    beyond = torch.arange(width, device=logits.device)[None, :] >= k
    p = (values / t).masked_fill(beyond, float("-inf")).softmax(dim=-1)
    p = p * ((p.cumsum(dim=-1) - p) < top_p[:, None])  # the nucleus of the k
    cdf = p.cumsum(dim=-1)
    j = torch.searchsorted(cdf, (uniform[:, None] * cdf[:, -1:]).contiguous(), right=True).clamp_(max=width - 1)
    return torch.where(greedy, index[:, 0], index.gather(1, j).squeeze(1))
