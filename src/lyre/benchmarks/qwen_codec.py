"""``benchmark.py --mode codec --family qwen3-tts``: the 12 Hz decoder's cost per emitted frame, and
whether an onnxruntime export would pay.

The decoder has the real architecture (``DecoderConfig()``: 8-layer transformer, decoder_dim 1536;
random weights: the timing is the real model's, the audio noise). For each batch size B, B
streams advance together by ``chunk`` frames a round through the codec runtime
(:class:`~lyre.codec.qwen12hz.runtime.TwelveHzCodec`, torch, carried state), as sessions that
flush in the same round do; after warm-up rounds, the decode time is divided by the frames emitted.

The export question is answered on the stateless decode of one chunk (the same convolutions and
transformer, without the carried context): torch's against onnxruntime's on an export of it, at
each batch size. The stateful streaming export would be the work; this ratio bounds its gain.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lyre.codec import StreamSettings, runtime_threads
from lyre.codec.qwen12hz import Decoder, DecoderConfig
from lyre.codec.qwen12hz.runtime import TwelveHzCodec

WARMUP_ROUNDS, ROUNDS, CALLS = 3, 6, 5
FRAME_MS = 80.0


def real_decoder(seed: int = 0, cfg: DecoderConfig | None = None) -> Decoder:
    """The real architecture (or ``cfg``'s) with seeded random weights (eval, float32, CPU)."""
    torch.manual_seed(seed)
    decoder = Decoder(cfg or DecoderConfig()).eval().requires_grad_(False)
    for name, p in decoder.named_parameters():
        p.data = p.data.normal_(0, 0.02).abs_().add_(0.5) if name.endswith("cluster_usage") else p.data.normal_(0, 0.02)
    return decoder


def _stream_ms(codec: TwelveHzCodec, batch: int, chunk: int) -> float:
    settings = StreamSettings(first_flush_frames=chunk, every_flush_frames=chunk, max_chunk_frames=chunk)
    rng = np.random.default_rng(batch)
    streams = [codec.new_stream(settings) for _ in range(batch)]
    seconds, frames = 0.0, 0
    for r in range(WARMUP_ROUNDS + ROUNDS):
        for s in streams:
            codes = rng.integers(0, codec.decoder.cfg.codebook_size, (chunk + (r == 0), 16))
            s.push([tuple(int(x) for x in f) for f in codes])
        jobs = [j for s in streams if (j := s.plan(chunk, need_audio=True)) is not None]
        t0 = time.perf_counter()
        results = codec.decode(jobs)
        dt = time.perf_counter() - t0
        emitted = sum(len(job.stream.complete(job, res)) for job, res in zip(jobs, results, strict=True))
        if r >= WARMUP_ROUNDS:
            seconds, frames = seconds + dt, frames + emitted // 1920
    for s in streams:
        s.close()
    return 1000 * seconds / frames


def _timed(fn, *args) -> float:
    fn(*args)
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn(*args)
    return (time.perf_counter() - t0) / CALLS


class _Stateless(torch.nn.Module):
    def __init__(self, decoder: Decoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.decoder.decode(codes)


def _onnx_session(decoder: Decoder, chunk: int, max_batch: int, threads: int, where: Path) -> Any:
    import onnxruntime as ort

    path = where / "decoder12hz.onnx"
    batch = torch.export.Dim("batch", min=1, max=max(2, max_batch))
    torch.onnx.export(_Stateless(decoder), (torch.zeros(2, 16, chunk, dtype=torch.long),), str(path), dynamo=True,
                      dynamic_shapes=({0: batch},), input_names=["codes"], output_names=["audio"], verbose=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run(batches: list[int], chunk: int, runtimes: list[str], cpu_threads: int = 0, progress=print,
        decoder_config: DecoderConfig | None = None) -> dict[str, Any]:
    """``decoder_config``: another decoder's shape than the real one (the tests' tiny one)."""
    decoder = real_decoder(cfg=decoder_config)
    rows: list[dict[str, Any]] = []
    for b in batches:
        progress(f"codec (12 Hz): streaming, torch, batch {b} ...")
        rows.append({"what": "stream", "runtime": "torch", "batch": b,
                     "ms_per_frame": _stream_ms(TwelveHzCodec(decoder), b, chunk)})
    if "onnxruntime" not in runtimes:
        return {"chunk_frames": chunk, "rows": rows, "real_time_ms_per_frame": FRAME_MS}
    intra, _ = runtime_threads("onnxruntime", cpu_threads)
    with tempfile.TemporaryDirectory() as tmp:
        progress("codec (12 Hz): exporting the stateless decode to ONNX (a minute) ...")
        session = _onnx_session(decoder, chunk, max(batches), intra, Path(tmp))
        for b in batches:
            progress(f"codec (12 Hz): stateless decode, torch and onnxruntime, batch {b} ...")
            codes = torch.randint(0, decoder.cfg.codebook_size, (b, 16, chunk))
            with torch.inference_mode():
                want = decoder.decode(codes)[:, 0].numpy()
                eager = _timed(decoder.decode, codes)
            feed = {"codes": codes.numpy()}
            got = session.run(None, feed)[0][:, 0]
            ort_s = _timed(session.run, None, feed)
            frames = b * chunk
            rows.append({"what": "stateless", "runtime": "torch", "batch": b, "ms_per_frame": 1000 * eager / frames})
            rows.append({"what": "stateless", "runtime": "onnxruntime", "batch": b, "ms_per_frame": 1000 * ort_s / frames,
                         "speedup_vs_torch": eager / ort_s, "max_error_vs_torch": float(np.abs(got - want).max())})
    return {"chunk_frames": chunk, "rows": rows, "real_time_ms_per_frame": FRAME_MS}


def table(result: dict[str, Any]) -> str:
    lines = [f"12 Hz decoder (real architecture), chunk = {result['chunk_frames']} frames; real time = "
             f"{result['real_time_ms_per_frame']:.0f} ms of audio per frame",
             f"{'decode':<11}{'runtime':<13}{'batch':>6}{'ms / frame':>12}{'x torch':>9}{'max err':>10}"]
    for r in result["rows"]:
        speed = f"{r['speedup_vs_torch']:.2f}" if "speedup_vs_torch" in r else "-"
        err = f"{r['max_error_vs_torch']:.1e}" if "max_error_vs_torch" in r else "-"
        lines.append(f"{r['what']:<11}{r['runtime']:<13}{r['batch']:>6}{r['ms_per_frame']:>12.1f}{speed:>9}{err:>10}")
    return "\n".join(lines)
