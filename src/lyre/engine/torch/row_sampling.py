"""Sampling decided on the device, over static shapes, as a CUDA graph needs: each row's temperature
(0 = greedy), top-k (0 = off) and top-p are tensors, and its uniform draw is a tensor too, so one
fixed sequence of operations samples a batch whatever rules its rows follow, and nothing is read back.

:func:`draw_bits` makes those draws on the host from a per-row seed and a per-row counter (a
counter-based generator: a hash of the pair), so a row's draws depend on its own seed and position
only: the same alone or beside any rows, on a CPU or a GPU, and without a generator state to carry
or restore; they reach the device with the step's other inputs.
"""

from __future__ import annotations

import numpy as np
import torch

_MASK32 = 0xFFFFFFFF
# odd multipliers below 2**31: a 32-bit value times one stays below 2**63 (exact in int64 and uint64 alike)
_MULTIPLIERS = (0x7FEB352D, 0x2C1B3C6D, 0x297A2D39)
DRAW_BITS = 24  # a draw's resolution: exact in float32, never 1.0


def _mix(x: np.ndarray) -> np.ndarray:
    """A 32-bit integer hash (xor-shift-multiply rounds) of ``x`` (uint64 values in [0, 2**32))."""
    for m in _MULTIPLIERS:
        x = x ^ (x >> np.uint64(16))
        x = (x * np.uint64(m)) & np.uint64(_MASK32)
    return x ^ (x >> np.uint64(15))


def draw_bits(seeds: np.ndarray | list[int], counters: np.ndarray | list[int], stream: int = 0) -> np.ndarray:
    """(B,) int64 draws in [0, 2**24), one per row: a function of the row's seed (any int64), counter
    (>= 0) and ``stream`` (which draw of the step: 0 for the token) only. Made on the host, where the
    seed and the counter are known, and sent to the device with the step's inputs."""
    seed = np.asarray(seeds, dtype=np.int64).astype(np.uint64)
    counter = np.asarray(counters, dtype=np.int64).astype(np.uint64)
    m32, s32 = np.uint64(_MASK32), np.uint64(32)
    x = _mix((counter & m32) ^ _mix(((seed >> s32) & m32) ^ _mix((seed & m32) ^ np.uint64(stream * 0x9E3779B9 & _MASK32))))
    x = _mix(x ^ ((counter >> s32) & m32))
    return (x >> np.uint64(32 - DRAW_BITS)).astype(np.int64)


def uniform(bits: torch.Tensor) -> torch.Tensor:
    """:func:`draw_bits` as float32 draws in [0, 1)."""
    return bits.to(torch.float32) * (1.0 / (1 << DRAW_BITS))


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                uniform: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """(B,) a column per row of ``logits`` (B, V): greedy where temperature is 0, else among its
    ``top_k`` best (0: all), within their ``top_p`` nucleus, by inverse CDF at ``uniform`` (B,).
    ``width``: how many best columns are ranked (at least every row's top_k; default all)."""
    width = min(width or logits.shape[1], logits.shape[1])
    if width < logits.shape[1]:
        values, index = logits.topk(width, dim=-1)  # (B, width) most likely first
    else:  # (every column: one segmented sort, not a selection then a sort)
        values, index = logits.sort(dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k, width).clamp(max=width)[:, None]
    greedy = temperature <= 0
    t = torch.where(greedy, 1.0, temperature)[:, None]
    beyond = torch.arange(width, device=logits.device)[None, :] >= k
    p = (values / t).masked_fill(beyond, float("-inf")).softmax(dim=-1)
    p = p * ((p.cumsum(dim=-1) - p) < top_p[:, None])  # the nucleus of the k
    cdf = p.cumsum(dim=-1)
    j = torch.searchsorted(cdf, (uniform[:, None] * cdf[:, -1:]).contiguous(), right=True).clamp_(max=width - 1)
    return torch.where(greedy, logits.argmax(dim=-1), index.gather(1, j).squeeze(1))  # (argmax: the first best)
