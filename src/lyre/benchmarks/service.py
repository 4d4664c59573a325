"""``benchmark.py --mode service``: concurrent streams through the library API (no network).

For each policy, codec mode and concurrency level, N streams start together; per stream it records TTFB
(request -> first chunk received) and underruns of a simulated player that starts at the first
chunk (a chunk is late when it arrives after the audio before it has finished playing). A stream
"stayed real time" when it had no late chunk. Per level it also reports the codec's frames decoded
per frame emitted and its decode time per emitted frame (from ``/v1/stats``'s ``codec``).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from lyre.benchmarks.figures import codec_figures, percentile
from lyre.config import LyreConfig, apply_overrides
from lyre.model.sample_texts import TEXT_SETS, without_tags
from lyre.service.tts import TTSService

TEXTS = TEXT_SETS["conversational"]


async def _one_stream(tts: TTSService, i: int, max_tokens: int) -> dict[str, Any]:
    t0 = time.monotonic()
    first = None
    audio_before = 0.0
    late = 0
    text = TEXTS[i % len(TEXTS)] if tts.family.name == "orpheus" else without_tags(TEXTS[i % len(TEXTS)])
    # (every stream max_tokens long: end of speech held back; Qwen3-TTS counts frames, within its text's cap)
    async for chunk in tts.stream(text, voice=tts.builtin_voices[i % len(tts.builtin_voices)], seed=i,
                                  max_tokens=max_tokens, min_tokens=max_tokens):
        now = time.monotonic()
        if first is None:
            first = now
        elif now > first + audio_before:
            late += 1
        audio_before += chunk.seconds
    return {"ttfb_ms": None if first is None else 1000 * (first - t0), "late_chunks": late, "audio_s": audio_before,
            "started": t0, "elapsed_s": time.monotonic() - t0}


async def _level(tts: TTSService, n: int, max_tokens: int) -> dict[str, Any]:
    """``n`` streams started together."""
    await tts.on_engine_thread(tts.scheduler.publish)
    before = tts.stats().as_dict()
    t0 = time.monotonic()
    streams = await asyncio.gather(*[_one_stream(tts, i, max_tokens) for i in range(n)])
    wall = time.monotonic() - t0
    await tts.on_engine_thread(tts.scheduler.publish)
    after = tts.stats().as_dict()
    return {"concurrency": n, **_summary(streams, wall), **codec_figures(before, after)}


async def poisson_level(tts: TTSService, rate: float, seconds: float, max_tokens: int, seed: int = 0
                        ) -> dict[str, Any]:
    """Streams arriving at ``rate`` a second (Poisson: exponential gaps, seeded) for ``seconds``, each
    measured to its end; ``mean_concurrency`` is the streams open on average while they arrived."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    tasks, at = [], rng.expovariate(rate)
    while at <= seconds:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        tasks.append(asyncio.create_task(_one_stream(tts, len(tasks), max_tokens)))
        at += rng.expovariate(rate)
    streams = await asyncio.gather(*tasks)
    wall = time.monotonic() - t0
    # stream seconds inside the arrival window
    busy = sum(max(0.0, min(s["started"] + s["elapsed_s"], t0 + seconds) - s["started"]) for s in streams)
    return {"rate": rate, "seconds": seconds, "arrivals": len(streams), "mean_concurrency": busy / seconds,
            **_summary(streams, wall)}


def _summary(streams: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    ttfb = [s["ttfb_ms"] for s in streams if s["ttfb_ms"] is not None]  # a stream may end before any audio
    return {
        "ttfb_ms_p50": percentile(ttfb, 0.50),
        "ttfb_ms_p95": percentile(ttfb, 0.95),
        "real_time_streams": sum(s["late_chunks"] == 0 and s["ttfb_ms"] is not None for s in streams),
        "late_chunks": sum(s["late_chunks"] for s in streams),
        "audio_s_per_wall_s": sum(s["audio_s"] for s in streams) / wall,
    }


async def _run_one(cfg: LyreConfig, concurrency: list[int], max_tokens: int, progress) -> list[dict[str, Any]]:
    async with TTSService(cfg) as tts:
        await tts.synthesize("warm up", seed=0)
        levels = []
        for n in concurrency:
            progress(f"service ({tts.family.name}, {cfg.scheduler.policy}, {cfg.codec.mode}): {n} concurrent "
                     f"streams ...")
            levels.append(await _level(tts, n, max_tokens))
        return levels


def run(cfg: LyreConfig, concurrency: list[int], policies: list[str], max_tokens: int,
        codec_modes: list[str] | None = None, progress=print) -> dict[str, Any]:
    """Every stream is ``max_tokens`` long (min_tokens holds back end-of-speech)."""
    top = max(concurrency)
    result: dict[str, Any] = {"runs": [], "max_tokens": max_tokens}
    for policy in policies:
        for mode in codec_modes or [cfg.codec.mode]:
            pcfg = apply_overrides(cfg, {
                "scheduler.policy": policy,
                "codec.mode": mode,
                "sampling.max_tokens": max_tokens,
                "sampling.min_tokens": max_tokens,
                "scheduler.max_concurrent_sessions": max(top, cfg.scheduler.max_concurrent_sessions),
            })
            levels = asyncio.run(_run_one(pcfg, concurrency, max_tokens, progress))
            result["runs"].append({"policy": policy, "codec_mode": mode, "levels": levels})
    result["settings"] = {"max_batch_size": cfg.scheduler.max_batch_size,
                          "flush_first_n_tokens": cfg.scheduler.flush_first_n_tokens,
                          "flush_every_n_tokens": cfg.scheduler.flush_every_n_tokens,
                          "warmup_frames": cfg.codec.warmup_frames,
                          "codec_runtime": cfg.codec.runtime}
    return result


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(result: dict[str, Any]) -> str:
    lines = [f"{'policy':<10}{'codec':<8}{'streams':>8}{'TTFB p50 ms':>13}{'TTFB p95 ms':>13}{'real-time':>11}"
             f"{'audio s/wall s':>16}{'dec/emit':>10}{'codec ms/frame':>16}"]
    for run in result["runs"]:
        for lv in run["levels"]:
            lines.append(f"{run['policy']:<10}{run['codec_mode']:<8}{lv['concurrency']:>8}{_fmt(lv['ttfb_ms_p50'], '.0f'):>13}"
                         f"{_fmt(lv['ttfb_ms_p95'], '.0f'):>13}{lv['real_time_streams']:>7}/{lv['concurrency']:<3}"
                         f"{lv['audio_s_per_wall_s']:>16.2f}{_fmt(lv['decoded_per_emitted'], '.2f'):>10}"
                         f"{_fmt(lv['codec_ms_per_frame'], '.1f'):>16}")
    return "\n".join(lines)
