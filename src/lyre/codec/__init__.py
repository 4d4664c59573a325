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
from typing import TYPE_CHECKING

import torch

from lyre.codec.base import StreamSettings
from lyre.codec.noise import configure_noise
from lyre.codec.stream import StreamCodec
from lyre.codec.streaming import StreamingSnac, StreamingUnsupported, fold_weight_norm
from lyre.codec.window import WindowCodec

if TYPE_CHECKING:
    from lyre.config import CodecConfig

__all__ = ["CodecError", "StreamCodec", "StreamSettings", "WindowCodec", "build_codec", "configure_noise", "resolve_runtime"]

log = logging.getLogger("lyre.codec")


class CodecError(ValueError):
    """The configured codec cannot run here (the message says why and what to set instead)."""


AUTO_CPU_RUNTIMES = ("onnxruntime",)  # what codec.runtime auto picks on CPU where installed (measured: README)


def resolve_runtime(requested: str, device: str) -> str:
    """``codec.runtime`` for stream mode on ``device``: auto = the fastest installed CPU runtime on CPU,
    torch elsewhere."""
    from lyre.codec import onnx

    if requested in onnx.RUNNERS:
        if device != "cpu":
            raise CodecError(f"codec.runtime {requested} runs on the CPU only; codec.device is {device}: use torch")
        if (missing := onnx.available(requested)) is not None:
            raise CodecError(f"codec.runtime {requested}: {missing}")
        return requested
    if requested == "auto" and device == "cpu":
        return next((r for r in AUTO_CPU_RUNTIMES if onnx.available(r) is None), "torch")
    return "torch"


def build_codec(cfg: CodecConfig, snac: torch.nn.Module, device: str, dtype: torch.dtype,
                threads: int = 0) -> StreamCodec | WindowCodec:
    """The codec ``cfg`` asks for over ``snac`` (loaded, its noise configured); ``threads`` for a CPU
    runtime (0: every core). SNAC's weight norm is folded once (the same weights, no longer
    recomputed on every call)."""
    if cfg.mode == "window":
        return WindowCodec(fold_weight_norm(snac), device, dtype)
    try:
        model = StreamingSnac(snac).eval()
    except StreamingUnsupported as e:
        raise CodecError(str(e)) from None
    runtime = resolve_runtime(cfg.runtime, device)
    runner = offline = None
    if runtime != "torch":
        from lyre.codec.onnx import RUNNERS, OnnxUnavailable

        try:
            runner, offline = (RUNNERS[runtime](model, cfg.onnx_dir, kind, threads) for kind in ("stream", "offline"))
        except OnnxUnavailable as e:
            raise CodecError(f"codec.runtime {runtime}: {e}") from None
    codec = StreamCodec(model, runner, runtime, device, dtype, noise_seed=cfg.noise_seed, offline=offline)
    log.info("codec: stream mode on %s (%s%s); exact audio trails the newest frame by %d samples; "
             "decoder state %.2f MB per stream", device, runtime, f", {threads} threads" if runner else "", model.lag,
             model.state_bytes / 1e6)
    return codec
