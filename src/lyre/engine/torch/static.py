"""A decode step over static shapes: every tensor's shape and address fixed by (rows, length), so
that on a GPU the step is one CUDA graph per bucket and the same code runs eagerly on a CPU.

Rows are slots: row r is slot r, for the slots 0..R-1 of the smallest bucket that holds every
decoding slot (the slot pool hands out the lowest free slot, so the range stays dense); a slot in
that range that does not decode this step is a gap row. Attention reads each row's K/V in place,
``cache.k[layer][:R, :, :L]`` (a view whose address never changes), for the smallest length bucket
L that holds every row's position, masked to the row's own positions. A gap row attends to its
key 0 only and writes its K/V at the cache's scratch position, which no sequence reads: it changes
nothing.
"""

from __future__ import annotations

import bisect

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from lyre.engine.torch.llama import SDPA_BACKENDS, KVCache, Llama

MIN_LENGTH = 64  # the smallest length bucket


def bucket(n: int, smallest: int, largest: int) -> int:
    """The smallest power of two >= max(n, smallest), at most ``largest``."""
    return min(largest, 1 << (max(n, smallest) - 1).bit_length())


def buckets(smallest: int, largest: int) -> list[int]:
    """Every value :func:`bucket` can return: powers of two from ``smallest``, then ``largest``."""
    out = [min(smallest, largest)]
    while out[-1] < largest:
        out.append(min(out[-1] * 2, largest))
    return out


def slot_buckets(slots: int) -> list[int]:
    """Row counts a static step runs: powers of two up to 32, then every 32 (a batch of 129 rows runs
    160, not 256: gap rows cost what real ones do), then ``slots``."""
    out = [b for b in buckets(1, 32) if b < slots] + list(range(64, slots, 32))
    return [*out, slots]


def length_buckets(max_seq_len: int) -> list[int]:
    """Key lengths a static step attends over: 64 and 128, then every 128 up to 1024, then every 1024
    (attention reads every row's K/V up to the bucket), then ``max_seq_len``."""
    out = [n for n in (64, 128) if n < max_seq_len] + list(range(256, min(max_seq_len, 1025), 128))
    out += list(range(2048, max_seq_len, 1024))
    return [*(n for n in out if n < max_seq_len), max_seq_len]


def fit(n: int, choices: list[int]) -> int:
    """The smallest of ``choices`` (ascending) that holds ``n``."""
    return choices[bisect.bisect_left(choices, n)]


def static_forward(llama: Llama, cache: KVCache, x: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
                   length: int) -> torch.Tensor:
    """Rows ``x`` (R, H) of slots 0..R-1 at ``positions`` (R,), ``valid`` (R,) where a slot decodes:
    their K/V written in place, each attending to its slot's first ``length`` positions; the final
    normed hidden states (R, H) (a gap row's is meaningless)."""
    r = x.shape[0]
    cos = llama.rope_cos[positions].unsqueeze(1)  # (R, 1, hd)
    sin = llama.rope_sin[positions].unsqueeze(1)
    key = torch.arange(length, device=x.device)[None, :]  # (1, L)
    visible = ((key <= positions[:, None]) & valid[:, None]) | ((key == 0) & ~valid[:, None])  # (R, L)
    mask = additive(visible, x.dtype)[:, None, None, :]  # (R, 1, 1, L), made once a step
    slots = torch.arange(r, device=x.device)
    at = torch.where(valid, positions, cache.scratch)  # (a gap row writes where no sequence reads)
    with sdpa_kernel(SDPA_BACKENDS):
        for i, layer in enumerate(llama.layers):
            attn = layer.self_attn
            q, k, v = attn.qkv(layer.input_layernorm(x), cos, sin)  # (R, nh, hd), (R, nkv, hd) x2
            cache.write(i, slots, at, k, v)
            # a KV head's query heads are its query rows: (R, nkv, G, hd) against (R, nkv, L, hd), K/V read in place
            qg = q.view(r, attn.n_kv, attn.n_heads // attn.n_kv, attn.head_dim)
            out = F.scaled_dot_product_attention(qg, cache.k[i][:r, :, :length], cache.v[i][:r, :, :length],
                                                 attn_mask=mask)  # (R, nkv, G, hd)
            x = x + attn.o_proj(out.reshape(r, attn.n_heads * attn.head_dim))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
    return llama.norm(x)


def additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as the additive one SDPA would make of it in every layer: 0 where
    ``visible``, -inf elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
