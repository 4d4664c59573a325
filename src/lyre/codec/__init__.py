"""SNAC audio for streams of Orpheus frames.

- :mod:`lyre.codec.streaming`: the exact streaming decoder (each frame decoded once);
- :mod:`lyre.codec.stream`: ``codec.mode: stream`` — its per-segment chunk planning and batched runner;
- :mod:`lyre.codec.window`: ``codec.mode: window`` — chunks decoded inside windows of context frames;
- :mod:`lyre.codec.onnx`: the streaming decoder run by ONNX Runtime (``codec.runtime``);
- :mod:`lyre.codec.noise`: SNAC's decoder noise, switched off or seeded.

Both modes offer the same interface: ``codec.new_stream(settings)`` gives a segment's stream
(``push`` frames, ``finish``, ``plan(chunk_frames) -> job``, ``complete(job, result) -> pcm``,
``close``), ``codec.decode(jobs)`` runs the jobs of one round in batched calls, ``codec.counters``
counts frames decoded and emitted, ``codec.stats()`` is the ``/v1/stats`` ``codec`` entry.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lyre.codec import onnx
from lyre.codec.base import CodecCounters, StreamSettings
from lyre.codec.noise import configure_noise
from lyre.codec.onnx import RUNNERS, OnnxUnavailable
from lyre.codec.stream import StreamCodec
from lyre.codec.streaming import StreamingSnac, StreamingUnsupported, fold_weight_norm
from lyre.codec.window import WindowCodec
from lyre.config import CodecConfig
from lyre.model import orpheus

__all__ = ["CodecError", "CodecGraphs", "StreamCodec", "StreamSettings", "WindowCodec", "build_codec", "configure_noise",
           "load_graphs", "resolve_runtime", "runtime_threads", "warm_up"]

log = logging.getLogger("lyre.codec")


class CodecError(ValueError):
    """The configured codec cannot run here (the message says why and what to set instead)."""


AUTO_CPU_RUNTIMES = ("onnxruntime",)  # what codec.runtime auto picks on CPU where installed (measured: README)


def resolve_runtime(requested: str, device: str) -> str:
    """``codec.runtime`` for stream mode on ``device``: auto = the fastest installed CPU runtime on CPU,
    torch elsewhere."""
    if requested in onnx.RUNNERS:
        if device != "cpu":
            raise CodecError(f"codec.runtime {requested} runs on the CPU only; codec.device is {device}: use torch")
        if (missing := onnx.available(requested)) is not None:
            raise CodecError(f"codec.runtime {requested}: {missing}")
        return requested
    if requested == "auto" and device == "cpu":
        return next((r for r in AUTO_CPU_RUNTIMES if onnx.available(r) is None), "torch")
    return "torch"


@dataclass(frozen=True)
class CodecGraphs:
    """What a codec runs, built once from a loaded SNAC and shareable by several codecs (it holds no
    stream's state): the decoder (streaming, or with its weight norm folded for window mode) and,
    for a CPU runtime, its exported graphs opened."""

    mode: str
    model: torch.nn.Module
    runtime: str = "torch"
    runner: Any = None  # the stream graph's runner (a CPU runtime), else the torch module runs
    offline: Any = None  # the offline graph's runner, for warm-up decodes of a whole window

    def describe(self, threads: int) -> str:
        if not self.runner:
            return self.runtime
        intra, parallel = runtime_threads(self.runtime, threads)
        return f"{self.runtime}, {parallel} concurrent calls of 1 thread" if parallel > 1 else \
            f"{self.runtime}, {intra} threads"


MAX_PARALLEL_CALLS = 4


def runtime_threads(runtime: str, threads: int) -> tuple[int, int]:
    """(intra-op threads per call, concurrent calls a batch is split into) for ``threads`` cores (0:
    every core). onnxruntime's session runs concurrently: a batch split across one-thread calls
    decodes 8 streams in 0.5x one call's time on 2 cores, against 0.7x with 2 intra-op threads. At
    most 4 calls, the cores shared among them (a lone stream's call, never split, keeps
    ``cores / calls`` threads); openvino's one infer request cannot run concurrently: threads."""
    cores = threads or os.cpu_count() or 1
    if runtime != "onnxruntime":
        return cores, 1
    calls = min(cores, MAX_PARALLEL_CALLS)
    return max(1, cores // calls), calls


def load_graphs(cfg: CodecConfig, snac: torch.nn.Module, device: str, threads: int = 0) -> CodecGraphs:
    """The decoder ``cfg`` asks for over ``snac`` (loaded, its noise configured); ``threads`` for a CPU
    runtime (0: every core). SNAC's weight norm is folded once (the same weights, no longer
    recomputed on every call)."""
    if cfg.mode == "window":
        return CodecGraphs("window", fold_weight_norm(snac))
    try:
        model = StreamingSnac(snac).eval()
    except StreamingUnsupported as e:
        raise CodecError(str(e)) from None
    runtime = resolve_runtime(cfg.runtime, device)
    if runtime == "torch":
        return CodecGraphs("stream", model)
    try:
        intra, _ = runtime_threads(runtime, threads)
        runner, offline = (RUNNERS[runtime](model, cfg.onnx_dir, kind, intra) for kind in ("stream", "offline"))
    except OnnxUnavailable as e:
        raise CodecError(f"codec.runtime {runtime}: {e}") from None
    return CodecGraphs("stream", model, runtime, runner, offline)


def build_codec(cfg: CodecConfig, snac: torch.nn.Module, device: str, dtype: torch.dtype, threads: int = 0,
                graphs: CodecGraphs | None = None) -> StreamCodec | WindowCodec:
    """The codec ``cfg`` asks for over ``snac`` (see :func:`load_graphs`), or over ``graphs`` loaded before."""
    graphs = graphs if graphs is not None else load_graphs(cfg, snac, device, threads)
    if graphs.mode == "window":
        return WindowCodec(graphs.model, device, dtype)
    model = graphs.model
    parallel = runtime_threads(graphs.runtime, threads)[1] if graphs.runner else 1
    codec = StreamCodec(model, graphs.runner, graphs.runtime, device, dtype, noise_seed=cfg.noise_seed,
                        offline=graphs.offline, parallel=parallel)
    log.info("codec: stream mode on %s (%s); exact audio trails the newest frame by %d samples; "
             "decoder state %.2f MB per stream", device, graphs.describe(threads), model.lag, model.state_bytes / 1e6)
    return codec


def warm_up(codec: StreamCodec | WindowCodec, settings: StreamSettings) -> None:
    """Decode one stream of random frames the way a first request would (a first chunk, warm-up
    chunks, chunks of every size up to ``max_chunk_frames``, the closing one), so that a runtime's
    first-run costs (graph optimisation, memory pools, kernels for each shape) are paid before any
    listener waits; then zero the counters."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    stream = codec.new_stream(settings)
    sizes = [1] * settings.warmup_frames + list(range(1, settings.max_chunk_frames + 1)) + [1]
    for i, size in enumerate(sizes):
        stream.push([tuple(int(x) for x in f) for f in rng.integers(0, orpheus.CODEBOOK_SIZE, (size, orpheus.FRAME_TOKENS))])
        if i == len(sizes) - 1:
            stream.finish()
        while (job := stream.plan(size, need_audio=True)) is not None:
            result = codec.decode([job])[0]
            if isinstance(result, Exception):
                raise CodecError(f"the codec fails on its warm-up: {type(result).__name__}: {result}") from result
            stream.complete(job, result)
    stream.close()
    codec.counters = CodecCounters()
    log.info("codec warmed up in %.2f s", time.perf_counter() - t0)
