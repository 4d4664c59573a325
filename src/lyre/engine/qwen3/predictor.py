"""The code predictor's frame: codebooks 1-15 of a batch of rows, sampling included, as one fixed
sequence of tensor operations over static shapes, so that on a GPU the whole 15-pass loop is one
CUDA graph per batch-size bucket (:class:`FrameLoop`), and the same code runs eagerly on a CPU.

Sampling inside the loop decides nothing on the host: each row's temperature (0 = greedy), top-k
(0 = the whole 2048 codes) and top-p are tensors, and its 15 uniform draws for the frame come from
its own generator before the loop (one host call per row per frame, uploaded in one copy), so a
row's codes never depend on the rows beside it. A pass ranks the 64 best codes (every code when a
row's top-k is 0 or above 64: a graph per bucket and width), keeps a row's k best, its nucleus of
those, and picks by inverse CDF.

The CUDA graphs have never run: no GPU was lent to this project while they were written. Capture
is tried once per bucket; a capture that fails is logged and that bucket runs eagerly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from lyre.engine.qwen3.model import PASSES, FrameKV, Talker
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
    def of(cls, params: list, generators: list[torch.Generator], device: torch.device) -> RowSampling:
        """``params``: each row's CodeSampling; ``generators``: each row's own (15 draws each, used or not)."""
        host = torch.cat([torch.tensor([[p.temperature, float(p.top_k), p.top_p] for p in params]),
                          torch.stack([torch.rand(PASSES, generator=g) for g in generators])], dim=1)  # (B, 18)
        packed = upload(host, device)
        return cls(packed[:, 0], packed[:, 1].long(), packed[:, 2], packed[:, 3:],
                   shortlist([p.top_k for p in params], CODES))


SHORTLIST = 64  # codes a pass ranks when every row's top_k is at most this (the default is 50), else all


def shortlist(top_k: list[int], vocab: int) -> int:
    """How many of a pass's best codes the batch needs ranked (decided on the host, once a frame)."""
    return SHORTLIST if all(0 < k <= SHORTLIST for k in top_k) else vocab


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                uniform: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """(B,) a code per row of ``logits`` (B, V): greedy where temperature is 0, else among its
    ``top_k`` best (0: all), within their ``top_p`` nucleus, by inverse CDF at ``uniform`` (B,).
    ``width``: how many best codes are ranked (at least every row's top_k; default all)."""
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
    graph of the smallest power-of-two bucket that holds the batch, its inputs copied into that
    graph's static buffers (padding rows repeat row 0; their codes are dropped)."""

    def __init__(self, model: Talker, kv: FrameKV, graphs: bool = False):
        self.model, self.kv = model, kv
        self.graphs = graphs
        # (bucket, width) -> its graph and static buffers; None: its capture failed
        self._captured: dict[tuple[int, int | None], tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]] | None] = {}

    def __call__(self, hidden: torch.Tensor, c0: torch.Tensor, s: RowSampling) -> torch.Tensor:
        if not self.graphs:
            return frame_codes(self.model, self.kv, hidden, c0, s)
        b = hidden.shape[0]
        bucket = 1 << (b - 1).bit_length()
        graph = self._captured.get((bucket, s.width))  # (never captured mid-serving: see prepare)
        if graph is None:
            return frame_codes(self.model, self.kv, hidden, c0, s)
        cuda_graph, io = graph
        for name, value in (("hidden", hidden), ("c0", c0), ("temperature", s.temperature), ("top_k", s.top_k),
                            ("top_p", s.top_p), ("uniform", s.uniform)):
            io[name][:b].copy_(value)
            io[name][b:].copy_(value[:1].expand_as(io[name][b:]))
        cuda_graph.replay()
        return io["codes"][:b].clone()

    def prepare(self, device: torch.device) -> None:
        """Capture every bucket's graphs now, at start, for both widths (the shortlist, and every code
        for a top-k of 0 or above it): a capture while serving would hold up every stream, and CUDA's
        capture refuses the allocations another thread (the codec's) makes meanwhile. A batch whose
        bucket has no graph (its capture failed) runs eagerly."""
        bucket, dtype = 1, self.model.text_fc2.weight.dtype
        while bucket <= self.kv.batch:
            for width in (SHORTLIST, CODES):
                rows = RowSampling(torch.full((bucket,), 0.9, device=device), torch.full((bucket,), 50, device=device),
                                   torch.ones(bucket, device=device), torch.rand(bucket, PASSES, device=device),
                                   width)
                self._graph((bucket, width), torch.zeros(bucket, self.model.cfg.hidden_size, dtype=dtype,
                                                         device=device),
                            torch.zeros(bucket, dtype=torch.long, device=device), rows)
            bucket *= 2

    def _graph(self, key: tuple[int, int | None], hidden: torch.Tensor, c0: torch.Tensor, s: RowSampling):
        if key not in self._captured:
            self._captured[key] = self._capture(key[0], hidden, c0, s)
        return self._captured[key]

    def _capture(self, bucket: int, hidden: torch.Tensor, c0: torch.Tensor, s: RowSampling):
        """The bucket's graph and its static buffers (None: capture failed, the bucket runs eagerly)."""
        def static(t: torch.Tensor) -> torch.Tensor:
            return t[:1].expand(bucket, *t.shape[1:]).clone()

        io = {"hidden": static(hidden), "c0": static(c0), "temperature": static(s.temperature),
              "top_k": static(s.top_k), "top_p": static(s.top_p), "uniform": static(s.uniform)}
        try:
            rows = RowSampling(io["temperature"], io["top_k"], io["top_p"], io["uniform"], s.width)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # (warm-up runs before capture, as CUDA graphs require)
                for _ in range(2):
                    frame_codes(self.model, self.kv, io["hidden"], io["c0"], rows)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                io["codes"] = frame_codes(self.model, self.kv, io["hidden"], io["c0"], rows)
            log.info("code predictor: a CUDA graph for batches of up to %d rows", bucket)
            return graph, io
        except Exception as e:  # noqa: BLE001 - never run on a GPU: eager rather than down
            log.warning("code predictor: capturing a CUDA graph for %d rows failed (%s: %s); it runs eagerly",
                        bucket, type(e).__name__, e)
            return None

