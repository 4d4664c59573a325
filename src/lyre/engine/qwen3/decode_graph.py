"""The talker's decode step over static shapes, so that on a GPU it is one CUDA graph per
(slot bucket, length bucket), and the same code runs eagerly on a CPU.

A decode-only step (no prompt chunk in it) is laid out by slot: row r is slot r, for the slots
0..R-1 of the smallest bucket (a power of two, at most the cache's slots) that holds every
decoding slot; a slot in that range that does not decode this step is a gap row. Attention reads
each row's K/V in place, ``cache.k[layer][:R, :, :L]`` (a view whose address never changes), for
the smallest length bucket L that holds every row's position, masked to the row's own positions.
A gap row attends to its key 0 only and writes back the K/V it read at its position 0: it changes
nothing. Every shape and address is fixed by (R, L); what changes per step (the rows, positions,
which rows decode) is copied into the graph's static buffers before it is replayed.

The CUDA graphs have never run: no GPU was lent to this project while they were written. A capture
that fails is logged and that bucket runs eagerly; on a CPU nothing is captured (the test suite
holds the eager static step to the token engine's step).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from lyre.engine.torch.llama import SDPA_BACKENDS, KVCache, Llama

log = logging.getLogger("lyre.engine")

MIN_LENGTH = 64  # the smallest length bucket


def bucket(n: int, smallest: int, largest: int) -> int:
    """The smallest power of two >= max(n, smallest), at most ``largest``."""
    return min(largest, 1 << (max(n, smallest) - 1).bit_length())


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


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    x: torch.Tensor  # (R, H)
    positions: torch.Tensor  # (R,)
    valid: torch.Tensor  # (R,)
    hidden: torch.Tensor  # (R, H) its output


class StaticDecode:
    """Runs a decode-only step by :func:`static_forward`: eagerly, or (``graphs``, on a GPU) by
    replaying the graph of its (slot bucket, length bucket)."""

    def __init__(self, llama: Llama, cache: KVCache, graphs: bool = False):
        self.llama, self.cache, self.graphs = llama, cache, graphs
        self._captured: dict[tuple[int, int], _Graph | None] = {}
        self._pool = torch.cuda.graph_pool_handle() if graphs else None  # (every graph's memory shared)
        self.steps = self.gap_rows = 0  # steps run, and rows run for slots that did not decode

    def key(self, slots: list[int], positions: list[int]) -> tuple[int, int]:
        """(R, L) for rows of ``slots`` at ``positions``."""
        return (bucket(max(slots) + 1, 1, self.cache.slots),
                bucket(max(positions) + 1, MIN_LENGTH, self.cache.max_seq_len))

    def __call__(self, rows: torch.Tensor, slots: list[int], positions: list[int]) -> torch.Tensor:
        """``rows`` (N, H) of decoding ``slots`` at ``positions`` -> their normed hidden states (N, H)."""
        r, length = self.key(slots, positions)
        self.steps, self.gap_rows = self.steps + 1, self.gap_rows + r - len(slots)
        device = rows.device
        index = torch.tensor(slots, device=device)
        x = torch.zeros(r, rows.shape[1], dtype=rows.dtype, device=device)
        x[index] = rows
        host = torch.zeros(2, r, dtype=torch.long)
        host[0, slots], host[1, slots] = torch.tensor(positions), 1
        packed = host.to(device, non_blocking=True)
        pos, valid = packed[0], packed[1].bool()
        graph = self._captured.get((r, length)) if self.graphs else None  # (never captured mid-serving)
        if graph is None:
            return static_forward(self.llama, self.cache, x, pos, valid, length)[index]
        graph.x.copy_(x)
        graph.positions.copy_(pos)
        graph.valid.copy_(valid)
        graph.graph.replay()
        return graph.hidden[index]

    def prepare(self) -> None:
        """Capture every (slot bucket, length bucket) graph now, at start: a capture while serving
        would hold up every stream, and CUDA's capture refuses the allocations another thread (the
        codec's) makes meanwhile. A bucket whose capture failed runs eagerly."""
        r = 1
        while True:
            length = MIN_LENGTH
            while True:
                self._graph((r, length), torch.zeros(r, self.llama.cfg.hidden_size, dtype=self.llama.norm.weight.dtype,
                                                     device=self.llama.norm.weight.device))
                if length >= self.cache.max_seq_len:
                    break
                length = min(length * 2, self.cache.max_seq_len)
            if r >= self.cache.slots:
                return
            r = min(r * 2, self.cache.slots)

    def _graph(self, key: tuple[int, int], x: torch.Tensor) -> _Graph | None:
        if key not in self._captured:
            self._captured[key] = self._capture(key, x)
        return self._captured[key]

    def _capture(self, key: tuple[int, int], x: torch.Tensor) -> _Graph | None:
        r, length = key
        device = x.device
        static_x = torch.zeros_like(x)
        positions = torch.zeros(r, dtype=torch.long, device=device)
        valid = torch.zeros(r, dtype=torch.bool, device=device)  # (warm-up and capture as all gaps: nothing written)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # (warm-up runs before capture, as CUDA graphs require)
                for _ in range(2):
                    static_forward(self.llama, self.cache, static_x, positions, valid, length)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                hidden = static_forward(self.llama, self.cache, static_x, positions, valid, length)
            log.info("talker: a CUDA graph for decode steps over %d slots and %d positions", r, length)
            return _Graph(graph, static_x, positions, valid, hidden)
        except Exception as e:  # noqa: BLE001 - never run on a GPU: eager rather than down
            log.warning("talker: capturing a CUDA graph for %d slots and %d positions failed (%s: %s); it runs "
                        "eagerly", r, length, type(e).__name__, e)
            return None
