"""The talker's decode step over static shapes (:func:`lyre.engine.torch.static.static_forward`:
rows are slots 0..R-1, attention over a length bucket, gap rows that change nothing), so that on a
GPU it is one CUDA graph per (slot bucket, length bucket), and the same code runs eagerly on a CPU.

Every shape and address is fixed by (R, L); what changes per step (the rows, positions, which rows
decode) is copied into the graph's static buffers before it is replayed. Every graph is captured at
start; a capture that fails stops the start (GraphCaptureError names the bucket).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from lyre.engine.torch.cuda_graphs import Graph, GraphPool, capture
from lyre.engine.torch.llama import KVCache, Llama
from lyre.engine.torch.static import fit, length_buckets, slot_buckets, static_forward
from lyre.engine.torch.transfer import upload

log = logging.getLogger("lyre.engine")


@dataclass
class _Graph:
    graph: Graph
    x: torch.Tensor  # (R, H)
    positions: torch.Tensor  # (R,)
    valid: torch.Tensor  # (R,)


class StaticDecode:
    """Runs a decode-only step by :func:`static_forward`: eagerly, or (``graphs``, on a GPU) by
    replaying the graph of its (slot bucket, length bucket)."""

    def __init__(self, llama: Llama, cache: KVCache, graphs: bool = False):
        self.llama, self.cache, self.graphs = llama, cache, graphs
        self._captured: dict[tuple[int, int], _Graph] = {}
        self._pool = GraphPool()  # (every graph's memory shared)
        self.steps = self.gap_rows = 0  # steps run, and rows run for slots that did not decode

    def key(self, slots: list[int], positions: list[int]) -> tuple[int, int]:
        """(R, L) for rows of ``slots`` at ``positions``."""
        return fit(max(slots) + 1, slot_buckets(self.cache.slots)), fit(max(positions) + 1,
                                                                         length_buckets(self.cache.max_seq_len))

    def __call__(self, rows: torch.Tensor, slots: list[int], positions: list[int]) -> torch.Tensor:
        """``rows`` (N, H) of decoding ``slots`` at ``positions`` -> their normed hidden states (N, H)."""
        r, length = self.key(slots, positions)
        self.steps, self.gap_rows = self.steps + 1, self.gap_rows + r - len(slots)
        device = rows.device
        index = upload(slots, device)
        x = torch.zeros(r, rows.shape[1], dtype=rows.dtype, device=device)
        x[index] = rows
        host = torch.zeros(2, r, dtype=torch.long)
        host[0, slots], host[1, slots] = torch.tensor(positions), 1
        packed = host.to(device, non_blocking=True)
        pos, valid = packed[0], packed[1].bool()
        graph = self._captured.get((r, length))
        if graph is None:
            assert not self.graphs, f"no CUDA graph for {r} slots and {length} positions (prepare() captures them all)"
            return static_forward(self.llama, self.cache, x, pos, valid, length)[index]
        graph.x.copy_(x)
        graph.positions.copy_(pos)
        graph.valid.copy_(valid)
        return graph.graph.replay()[index]

    def prepare(self) -> None:
        """Capture every (slot bucket, length bucket) graph now, at start: a capture while serving
        would hold up every stream, and CUDA's capture refuses the allocations another thread (the
        codec's) makes meanwhile. Raises GraphCaptureError naming the first bucket that fails."""
        hidden, weight = self.llama.cfg.hidden_size, self.llama.norm.weight
        for r in slot_buckets(self.cache.slots):
            for length in length_buckets(self.cache.max_seq_len):
                if (r, length) not in self._captured:
                    self._captured[(r, length)] = self._capture(
                        r, length, torch.zeros(r, hidden, dtype=weight.dtype, device=weight.device))
        log.info("talker: %d CUDA graphs captured for its decode step", len(self._captured))

    def _capture(self, r: int, length: int, x: torch.Tensor) -> _Graph:
        static_x = torch.zeros_like(x)
        positions = torch.zeros(r, dtype=torch.long, device=x.device)
        valid = torch.zeros(r, dtype=torch.bool, device=x.device)  # (warm-up and capture as all gaps: nothing written)
        graph = capture(lambda: static_forward(self.llama, self.cache, static_x, positions, valid, length),
                        f"the talker's decode step over {r} slots and {length} positions", self._pool)
        return _Graph(graph, static_x, positions, valid)
