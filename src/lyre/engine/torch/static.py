"""A decode step over static shapes: every tensor's shape and address fixed by (rows, length), so
that on a GPU the step is one CUDA graph per bucket and the same code runs eagerly on a CPU.

Rows are slots: row r is slot r, for the slots 0..R-1 of the smallest bucket that holds every
decoding slot (the slot pool hands out the lowest free slot, so the range stays dense); a slot in
that range that does not decode this step is a gap row. Attention reads each row's K/V in place,
``cache.k[layer][:R, :, :L]`` (a view whose address never changes), for the smallest length bucket
L that holds every row's position, masked to the row's own positions. A gap row attends to its
key 0 only and writes back the K/V it read at its position 0: it changes nothing.
"""

from __future__ import annotations

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


def static_forward(llama: Llama, cache: KVCache, x: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
                   length: int) -> torch.Tensor:
    """Rows ``x`` (R, H) of slots 0..R-1 at ``positions`` (R,), ``valid`` (R,) where a slot decodes:
    their K/V written in place, each attending to its slot's first ``length`` positions; the final
    normed hidden states (R, H) (a gap row's is meaningless)."""
    r = x.shape[0]
    cos = llama.rope_cos[positions].unsqueeze(1)  # (R, 1, hd)
    sin = llama.rope_sin[positions].unsqueeze(1)
    key = torch.arange(length, device=x.device)[None, :]  # (1, L)
    own = (key <= positions[:, None]) & valid[:, None]
    mask = (own | ((key == 0) & ~valid[:, None]))[:, None, None, :]  # (R, 1, 1, L)
    slots = torch.arange(r, device=x.device)
    keep = valid[:, None, None]
    with sdpa_kernel(SDPA_BACKENDS):
        for i, layer in enumerate(llama.layers):
            attn = layer.self_attn
            q, k, v = attn.qkv(layer.input_layernorm(x), cos, sin)  # (R, nh, hd), (R, nkv, hd) x2
            for store, new in ((cache.k[i], k), (cache.v[i], v)):  # (a gap row writes back what it read)
                store[slots, :, positions] = torch.where(keep, new.to(store.dtype), store[slots, :, positions])
            # a KV head's query heads are its query rows: (R, nkv, G, hd) against (R, nkv, L, hd), K/V read in place
            qg = q.view(r, attn.n_kv, attn.n_heads // attn.n_kv, attn.head_dim)
            out = F.scaled_dot_product_attention(qg, cache.k[i][:r, :, :length], cache.v[i][:r, :, :length],
                                                 attn_mask=mask)  # (R, nkv, G, hd)
            x = x + attn.o_proj(out.reshape(r, attn.n_heads * attn.head_dim))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
    return llama.norm(x)
