"""``benchmark.py --mode codec``: SNAC decode cost per emitted frame, per codec mode and runtime.

For each batch size B, B streams advance together by ``chunk`` frames per round, as sessions that
flush in the same round do; after a few warm-up rounds, the time of the measured rounds' decode
calls is divided by the frames they emitted. Stream mode is measured on every runtime asked for
(torch eager, ONNX Runtime, OpenVINO: each where installed), window mode on torch; each runtime's
audio is compared with torch's on the same frames (noise off). The SNAC weights are the configured
codec's (the demo codec has the real 24 kHz architecture, so its timings are the real model's).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from lyre.codec import StreamSettings, WindowCodec, configure_noise, runtime_threads
from lyre.codec.stream import StreamCodec
from lyre.codec.streaming import StreamingSnac, fold_weight_norm
from lyre.config import LyreConfig
from lyre.model import checkpoint, orpheus

WARMUP_ROUNDS, ROUNDS = 4, 8


def _rounds(codec: Any, batch: int, chunk: int, settings: StreamSettings) -> tuple[float, float, np.ndarray]:
    """(ms per emitted frame, frames decoded per frame emitted, stream 0's audio) over the measured rounds."""
    rng = np.random.default_rng(batch)
    streams = [codec.new_stream(settings) for _ in range(batch)]
    audio0, seconds, emitted = [], 0.0, 0
    decoded_before = 0
    for r in range(WARMUP_ROUNDS + ROUNDS):
        if r == WARMUP_ROUNDS:
            decoded_before = codec.counters.frames_decoded
        jobs = []
        for s in streams:
            s.push([tuple(int(x) for x in f) for f in rng.integers(0, 4096, (chunk, 7))])
            if (job := s.plan(chunk, need_audio=s.emitted == 0)) is not None:  # the first chunk at once
                jobs.append(job)
        t0 = time.perf_counter()
        results = codec.decode(jobs)
        dt = time.perf_counter() - t0
        for job, result in zip(jobs, results, strict=True):
            pcm = job.stream.complete(job, result)
            if job.stream is streams[0]:
                audio0.append(pcm)
            if r >= WARMUP_ROUNDS:
                emitted += len(pcm)
        if r >= WARMUP_ROUNDS:
            seconds += dt
    for s in streams:
        s.close()
    frames = emitted / orpheus.SAMPLES_PER_FRAME
    return 1000 * seconds / frames, (codec.counters.frames_decoded - decoded_before) / frames, np.concatenate(audio0)


def run(cfg: LyreConfig, batches: list[int], chunk: int, runtimes: list[str], progress=print) -> dict[str, Any]:
    from lyre.codec import onnx

    snac_dir = checkpoint.resolve_model(cfg.model, cfg.codec).snac_dir
    snac = fold_weight_norm(configure_noise(checkpoint.load_snac(snac_dir), enabled=False))
    model = StreamingSnac(snac).eval()
    settings = StreamSettings(context_frames=cfg.codec.context_frames, every_flush_frames=chunk, max_chunk_frames=2 * chunk,
                              warmup_frames=1)
    rows: list[dict[str, Any]] = []
    reference: dict[int, np.ndarray] = {}
    for runtime in runtimes:
        if runtime != "torch" and (why := onnx.available(runtime)) is not None:
            progress(f"codec: {runtime} skipped: {why}")
            rows.append({"mode": "stream", "runtime": runtime, "skipped": why})
            continue
        runner = offline = None
        intra, parallel = runtime_threads(runtime, cfg.codec.cpu_threads) if runtime != "torch" else (0, 1)
        if runtime != "torch":
            runner, offline = (onnx.RUNNERS[runtime](model, cfg.codec.onnx_dir, kind, intra) for kind in onnx.KINDS)
        for b in batches:
            progress(f"codec: stream mode, {runtime}, batch {b} ...")
            codec = StreamCodec(model, runner, runtime, offline=offline, parallel=parallel)
            ms, ratio, audio = _rounds(codec, b, chunk, settings)
            codec.close()
            reference.setdefault(b, audio)
            n = min(len(audio), len(reference[b]))
            err = float(np.abs(audio[:n] - reference[b][:n]).max() / max(1e-9, np.abs(reference[b][:n]).max()))
            rows.append({"mode": "stream", "runtime": runtime, "batch": b, "ms_per_frame": ms, "decoded_per_emitted": ratio,
                         "max_error_vs_torch": err})
    for b in batches:
        progress(f"codec: window mode, torch, batch {b} ...")
        ms, ratio, _ = _rounds(WindowCodec(snac), b, chunk, settings)
        rows.append({"mode": "window", "runtime": "torch", "batch": b, "ms_per_frame": ms, "decoded_per_emitted": ratio})
    return {"chunk_frames": chunk, "rows": rows, "real_time_ms_per_frame": 1000 * orpheus.SAMPLES_PER_FRAME / orpheus.SAMPLE_RATE}


def table(result: dict[str, Any]) -> str:
    lines = [f"chunk = {result['chunk_frames']} frames; real time = {result['real_time_ms_per_frame']:.1f} ms of audio per frame",
             f"{'mode':<8}{'runtime':<13}{'batch':>6}{'ms / emitted frame':>20}{'decoded / emitted':>19}{'max err vs torch':>18}"]
    for r in result["rows"]:
        if "skipped" in r:
            lines.append(f"{r['mode']:<8}{r['runtime']:<13}  skipped: {r['skipped']}")
            continue
        err = f"{r['max_error_vs_torch']:.1e}" if "max_error_vs_torch" in r else "-"
        lines.append(f"{r['mode']:<8}{r['runtime']:<13}{r['batch']:>6}{r['ms_per_frame']:>20.1f}"
                     f"{r['decoded_per_emitted']:>19.2f}{err:>18}")
    return "\n".join(lines)
