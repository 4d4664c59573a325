"""``benchmark.py --mode text``: what text normalisation costs.

- Per sentence: the English normaliser (:mod:`lyre.text`) over the 200 call-centre sentences of
  :mod:`lyre.text.corpus_en`, after a warm-up pass, ``--requests`` rounds (each sentence timed on
  its own): p50, p99 and the slowest, in milliseconds.
- Against first audio: the configured server's library API (no network) speaks the same
  sentences one at a time with ``text_normalization`` on and off, alternating, and reports first
  audio (TTFB) p50/p95 of each and the normaliser's share of the TTFB p50. Normalisation runs on the
  caller's event loop when a request is prepared, never on the engine thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from lyre.config import LyreConfig
from lyre.text import normalize
from lyre.text.corpus_en import CORPUS

TTFB_TOKENS = 28  # audio tokens a timed request generates (its first chunk is what is timed)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def normaliser_ms(rounds: int) -> list[float]:
    """Each sentence's normalisation time, ``rounds`` times over, after one untimed pass."""
    for written, _ in CORPUS:
        normalize(written)
    times = []
    for _ in range(rounds):
        for written, _ in CORPUS:
            started = time.perf_counter()
            normalize(written)
            times.append(1000 * (time.perf_counter() - started))
    return times


async def _ttfb(tts: Any, text: str, normalization: str) -> float:
    started = time.perf_counter()
    stream = tts.stream(text, None, max_tokens=TTFB_TOKENS, text_normalization=normalization, seed=1)
    async for _ in stream:
        ttfb = 1000 * (time.perf_counter() - started)
        break
    await stream.aclose()
    return ttfb


def run(cfg: LyreConfig, requests: int, progress=print, spoken: int | None = None) -> dict[str, Any]:
    """``spoken``: sentences timed to first audio (default 10 a round, at least 20, at most all; 0: none)."""
    from lyre.service.tts import TTSService

    progress(f"text: the normaliser over {len(CORPUS)} sentences x {requests} ...")
    each = normaliser_ms(requests)
    ttfb: dict[str, list[float]] = {"on": [], "off": []}

    async def measure() -> None:
        async with TTSService(cfg) as tts:
            await _ttfb(tts, CORPUS[0][0], "on")  # (warm-up)
            count = spoken if spoken is not None else max(20, min(len(CORPUS), requests * 10))
            for i, (written, _) in enumerate(CORPUS[:count]):
                if i % 20 == 0:
                    progress(f"text: first audio, sentence {i + 1} ...")
                for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
                    ttfb[mode].append(await _ttfb(tts, written, mode))

    if spoken != 0:
        asyncio.run(measure())
    p50 = {m: _percentile(v, 0.5) if v else 0.0 for m, v in ttfb.items()}
    return {"sentences": len(CORPUS), "rounds": requests,
            "normalise_ms": {"p50": _percentile(each, 0.5), "p99": _percentile(each, 0.99), "max": max(each)},
            "ttfb_ms": {m: {"p50": p50[m], "p95": _percentile(v, 0.95) if v else 0.0, "n": len(v)}
                        for m, v in ttfb.items()},
            "share_of_ttfb_p50": _percentile(each, 0.5) / p50["on"] if p50["on"] else None}


def table(result: dict[str, Any]) -> str:
    n, t = result["normalise_ms"], result["ttfb_ms"]
    return "\n".join([
        f"normalising a sentence ({result['sentences']} sentences x {result['rounds']}): p50 {n['p50']:.3f} ms, "
        f"p99 {n['p99']:.3f} ms, slowest {n['max']:.3f} ms",
        f"first audio, normalisation on:  p50 {t['on']['p50']:.1f} ms, p95 {t['on']['p95']:.1f} ms "
        f"({t['on']['n']} requests)",
        f"first audio, normalisation off: p50 {t['off']['p50']:.1f} ms, p95 {t['off']['p95']:.1f} ms",
        f"normalisation's share of first audio (p50): {100 * (result['share_of_ttfb_p50'] or 0):.2f}%",
    ])
