"""``benchmark.py --mode service``: concurrent streams through the library API (no network).

For each policy and concurrency level, N streams start together; per stream it records TTFB
(request -> first chunk received) and underruns of a simulated player that starts at the first
chunk (a chunk is late when it arrives after the audio before it has finished playing). A stream
"stayed real time" when it had no late chunk.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from lyre.benchmarks.load import TEXT_SETS, percentile
from lyre.config import LyreConfig, apply_overrides
from lyre.service import TTSService

TEXTS = TEXT_SETS["conversational"]


async def _one_stream(tts: TTSService, i: int) -> dict[str, Any]:
    t0 = time.monotonic()
    first = None
    audio_before = 0.0
    late = 0
    async for chunk in tts.stream(TEXTS[i % len(TEXTS)], voice=tts.voices[i % len(tts.voices)], seed=i):
        now = time.monotonic()
        if first is None:
            first = now
        elif now > first + audio_before:
            late += 1
        audio_before += chunk.seconds
    return {"ttfb_ms": None if first is None else 1000 * (first - t0), "late_chunks": late, "audio_s": audio_before,
            "elapsed_s": time.monotonic() - t0}


async def _level(tts: TTSService, n: int) -> dict[str, Any]:
    t0 = time.monotonic()
    streams = await asyncio.gather(*[_one_stream(tts, i) for i in range(n)])
    wall = time.monotonic() - t0
    ttfb = [s["ttfb_ms"] for s in streams if s["ttfb_ms"] is not None]  # a stream may end before any audio
    return {
        "concurrency": n,
        "ttfb_ms_p50": percentile(ttfb, 0.50),
        "ttfb_ms_p95": percentile(ttfb, 0.95),
        "real_time_streams": sum(s["late_chunks"] == 0 and s["ttfb_ms"] is not None for s in streams),
        "late_chunks": sum(s["late_chunks"] for s in streams),
        "audio_s_per_wall_s": sum(s["audio_s"] for s in streams) / wall,
    }


async def _run_policy(cfg: LyreConfig, concurrency: list[int], progress) -> list[dict[str, Any]]:
    async with TTSService(cfg) as tts:
        await tts.synthesize("warm up", seed=0)
        levels = []
        for n in concurrency:
            progress(f"service ({cfg.scheduler.policy}): {n} concurrent streams ...")
            levels.append(await _level(tts, n))
        return levels


def run(cfg: LyreConfig, concurrency: list[int], policies: list[str], max_tokens: int, progress=print) -> dict[str, Any]:
    top = max(concurrency)
    result: dict[str, Any] = {"policies": {}, "max_tokens": max_tokens}
    for policy in policies:
        pcfg = apply_overrides(cfg, {
            "scheduler.policy": policy,
            "sampling.max_tokens": max_tokens,
            "scheduler.max_concurrent_sessions": max(top, cfg.scheduler.max_concurrent_sessions),
        })
        result["policies"][policy] = asyncio.run(_run_policy(pcfg, concurrency, progress))
    result["settings"] = {"max_batch_size": cfg.scheduler.max_batch_size,
                          "flush_first_n_tokens": cfg.scheduler.flush_first_n_tokens,
                          "flush_every_n_tokens": cfg.scheduler.flush_every_n_tokens,
                          "warmup_frames": cfg.codec.warmup_frames}
    return result


def table(result: dict[str, Any]) -> str:
    lines = [f"{'policy':<10}{'streams':>8}{'TTFB p50 ms':>13}{'TTFB p95 ms':>13}{'real-time':>11}{'audio s/wall s':>16}"]
    for policy, levels in result["policies"].items():
        for lv in levels:
            p50, p95 = (f"{v:.0f}" if v is not None else "-" for v in (lv["ttfb_ms_p50"], lv["ttfb_ms_p95"]))
            lines.append(f"{policy:<10}{lv['concurrency']:>8}{p50:>13}{p95:>13}"
                         f"{lv['real_time_streams']:>7}/{lv['concurrency']:<3}{lv['audio_s_per_wall_s']:>16.2f}")
    return "\n".join(lines)
