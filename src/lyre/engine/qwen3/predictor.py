"""The code predictor's frame: codebooks 1-15 of a batch of rows, sampling included, as one fixed
sequence of tensor operations over static shapes, so that on a GPU the whole 15-pass loop is one
CUDA graph per batch-size bucket (:class:`FrameLoop`), and the same code runs eagerly on a CPU.

Sampling inside the loop decides nothing on the host: each row's temperature (0 = greedy), top-k
(0 = the whole 2048 codes) and top-p are tensors, and its 15 uniform draws for the frame are made
on the host from its seed and frame count (counter-based, all rows at once, uploaded in one copy),
so a row's codes never depend on the rows beside it. A pass ranks the 64 best codes (every code when a
row's top-k is 0 or above 64: a graph per bucket and width), keeps a row's k best, its nucleus of
those, and picks by inverse CDF.

Every bucket's graphs are captured at start (on an H200 they made the frames the eager loop makes:
``python -m lyre.gpucheck``'s qwen3-tts stage); a capture that fails stops the start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from lyre.engine.qwen3.model import PASSES, FrameKV, Talker
from lyre.engine.torch.cuda_graphs import capture
from lyre.engine.torch.row_sampling import draw_bits, sample_rows, uniform
from lyre.engine.torch.static import bucket, buckets
from lyre.engine.torch.transfer import upload
from lyre.model.qwen3tts import CODES

log = logging.getLogger("lyre.engine")


@dataclass
class RowSampling:
    """A batch's code-predictor sampling, on the device: (B,) each, and (B, 15) uniforms; ``width``:
    the codes a pass ranks for it (:func:`shortlist`)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    uniform: torch.Tensor
    width: int | None = None

    @classmethod
    def of(cls, params: list, seeds: list[int], frames: list[int], device: torch.device) -> RowSampling:
        """``params``: each row's CodeSampling; ``seeds`` and ``frames`` (frames made so far): each row's
        15 draws, one per pass (:func:`~lyre.engine.torch.row_sampling.draw_bits`, streams 1-15)."""
        bits = np.stack([draw_bits(seeds, frames, stream) for stream in range(1, PASSES + 1)], axis=1)  # (B, 15)
        floats = torch.tensor([[p.temperature, float(p.top_k), p.top_p] for p in params], dtype=torch.float32)
        packed, draws = upload(floats, device), upload(torch.from_numpy(bits), device)
        return cls(packed[:, 0], packed[:, 1].long(), packed[:, 2], uniform(draws),
                   shortlist([p.top_k for p in params], CODES))


SHORTLIST = 64  # codes a pass ranks when every row's top_k is at most this (the default is 50), else all


def shortlist(top_k: list[int], vocab: int) -> int:
    """How many of a pass's best codes the batch needs ranked (decided on the host, once a frame)."""
    return SHORTLIST if all(0 < k <= SHORTLIST for k in top_k) else vocab


def frame_codes(model: Talker, kv: FrameKV, hidden: torch.Tensor, c0: torch.Tensor, s: RowSampling) -> torch.Tensor:
    """(B, 16) a frame's codes: ``c0`` (B,), then codebooks 1-15 from the talker's last normed
    hidden state ``hidden`` (B, H): the first pass reads both (positions 0-1), each later pass the
    code just drawn (positions 2-15), over the frame-local K/V."""
    cp = model.code_predictor
    x = torch.stack([hidden, model.decoder.embed(c0)], dim=1)  # (B, 2, H)
    h = cp(x, kv, 0)  # (B, Hcp)
    codes = [c0]
    for codebook in range(1, PASSES + 1):
        col = sample_rows(cp.logits(h, codebook), s.temperature, s.top_k, s.top_p, s.uniform[:, codebook - 1], s.width)
        codes.append(col)
        if codebook < PASSES:
            h = cp(cp.embeddings[codebook - 1](col)[:, None], kv, codebook + 1)
    return torch.stack(codes, dim=1)


class FrameLoop:
    """Runs :func:`frame_codes` for a batch: eagerly, or (``graphs``, on a GPU) by replaying the CUDA
    graph of the smallest bucket (a power of two, or the buffer's rows) that holds the batch, its inputs
    copied into that graph's static buffers (padding rows repeat row 0; their codes are dropped)."""

    def __init__(self, model: Talker, kv: FrameKV, graphs: bool = False):
        self.model, self.kv = model, kv
        self.graphs = graphs
        # (bucket, width) -> its graph and static buffers
        self._captured: dict[tuple[int, int | None], tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}

    def __call__(self, hidden: torch.Tensor, c0: torch.Tensor, s: RowSampling) -> torch.Tensor:
        if not self.graphs:
            return frame_codes(self.model, self.kv, hidden, c0, s)
        b = hidden.shape[0]
        cuda_graph, io = self._captured[(bucket(b, 1, self.kv.batch), s.width)]  # (all captured by prepare)
        for name, value in (("hidden", hidden), ("c0", c0), ("temperature", s.temperature), ("top_k", s.top_k),
                            ("top_p", s.top_p), ("uniform", s.uniform)):
            io[name][:b].copy_(value)
            io[name][b:].copy_(value[:1].expand_as(io[name][b:]))
        cuda_graph.replay()
        return io["codes"][:b].clone()

    def prepare(self, device: torch.device) -> None:
        """Capture every bucket's graphs now, at start, for both widths (the shortlist, and every code
        for a top-k of 0 or above it): a capture while serving would hold up every stream, and CUDA's
        capture refuses the allocations another thread (the codec's) makes meanwhile. Raises
        GraphCaptureError naming the first bucket that fails."""
        dtype = self.model.text_fc2.weight.dtype
        for rows_n in buckets(1, self.kv.batch):
            for width in (SHORTLIST, CODES):
                if (rows_n, width) in self._captured:
                    continue
                rows = RowSampling(torch.full((rows_n,), 0.9, device=device), torch.full((rows_n,), 50, device=device),
                                   torch.ones(rows_n, device=device), torch.rand(rows_n, PASSES, device=device), width)
                self._captured[(rows_n, width)] = self._capture(
                    rows_n, torch.zeros(rows_n, self.model.cfg.hidden_size, dtype=dtype, device=device),
                    torch.zeros(rows_n, dtype=torch.long, device=device), rows)

    def _capture(self, rows_n: int, hidden: torch.Tensor, c0: torch.Tensor, s: RowSampling):
        """The bucket's graph and its static buffers (GraphCaptureError: the capture failed)."""
        def static(t: torch.Tensor) -> torch.Tensor:
            return t[:1].expand(rows_n, *t.shape[1:]).clone()

        io = {"hidden": static(hidden), "c0": static(c0), "temperature": static(s.temperature),
              "top_k": static(s.top_k), "top_p": static(s.top_p), "uniform": static(s.uniform)}
        rows = RowSampling(io["temperature"], io["top_k"], io["top_p"], io["uniform"], s.width)
        graph = capture(lambda: frame_codes(self.model, self.kv, io["hidden"], io["c0"], rows),
                        f"the code predictor's frame over {rows_n} rows (width {s.width})")
        io["codes"] = graph.outputs
        return graph.graph, io
