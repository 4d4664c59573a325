"""Capturing a step as a CUDA graph, in one place (the Orpheus decode step, Qwen3-TTS's talker step
and code-predictor frame).

A graph replays the kernels its capture recorded, on the tensors it recorded them on: its inputs are
static buffers the caller copies each step's values into before :meth:`Graph.replay`, and its
outputs are the tensors the captured function returned, overwritten by every replay. Capture follows
PyTorch's recipe: the function runs on a side stream first (warm-up: lazy initialisation, cuBLAS
workspaces and autotuning happen outside the capture), then once under ``torch.cuda.graph``. Every
graph of an engine allocates from one memory pool: they never run at the same time, and each keeps
its outputs referenced, so what one graph frees another reuses (:class:`GraphPool`).

A capture that fails raises :class:`GraphCaptureError` naming the bucket: an engine captures every
bucket at start and refuses to start on a failure (``engine.cuda_graphs: false`` runs the same
code eagerly instead); a silent fall back to eager would serve at a fraction of the GPU's pace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger("lyre.engine")

WARMUP_RUNS = 3  # side-stream runs before a capture (PyTorch's own examples run 3)


class GraphCaptureError(RuntimeError):
    """A CUDA graph could not be captured; the message names the step and bucket, and the way out."""


@dataclass
class Graph:
    graph: Any  # torch.cuda.CUDAGraph
    outputs: Any  # what the captured function returned: overwritten by each replay of any graph of the pool

    def replay(self) -> Any:
        self.graph.replay()
        return self.outputs


class GraphPool:
    """The memory pool and the side stream every graph of one engine is warmed up and captured on
    (graphs sharing a pool are captured on one stream), made at the first capture. Its graphs are
    replayed one at a time, each one's outputs read or copied before the next replay: a later graph's
    outputs may lie in memory an earlier one uses while it runs."""

    def __init__(self) -> None:
        self.handle: Any = None
        self.stream: Any = None

    def open(self) -> GraphPool:
        if self.stream is None:
            self.handle, self.stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        return self


def capture(fn: Callable[[], Any], what: str, pool: GraphPool | None = None) -> Graph:
    """``fn`` (no arguments: it reads static buffers) warmed up on the pool's side stream, then captured
    there (cuBLAS's workspace for that stream is then made by the warm-up, not inside the graph).
    ``what`` names the step and bucket in the log and in the error. The capture is ``thread_local``:
    another thread's CUDA work meanwhile (a codec's) is neither refused nor captured."""
    try:
        pool = (pool or GraphPool()).open()
        pool.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(pool.stream):
            for _ in range(WARMUP_RUNS):
                fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool.handle, stream=pool.stream, capture_error_mode="thread_local"):
            outputs = fn()
        torch.cuda.current_stream().wait_stream(pool.stream)
    except Exception as e:
        raise GraphCaptureError(
            f"capturing the CUDA graph of {what} failed ({type(e).__name__}: {e}); set engine.cuda_graphs: false "
            "to run the same step eagerly (much slower)"
        ) from e
    log.debug("captured a CUDA graph of %s", what)
    return Graph(graph, outputs)
