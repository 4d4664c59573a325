"""The figures of a load run: percentiles, what the server's /v1/stats say changed, one summary per
level, per replica behind a balancer, and the search for the most users that meet an SLO."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class RequestResult:
    ok: bool
    ttfb_ms: float | None = None
    audio_s: float = 0.0
    wall_s: float = 0.0
    underruns: int | None = 0  # None: not measured (an encoded format)
    error: str | None = None

    @property
    def rtf(self) -> float | None:
        return self.wall_s / self.audio_s if self.audio_s else None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def prompt_figures(before: dict | None, after: dict | None, requests: int) -> dict[str, float | None]:
    """Prompt tokens per request, and how many of them the model ran (the rest came from kept prefixes)."""
    b, a = (before or {}).get("engine", {}), (after or {}).get("engine", {})
    if "prompt_tokens" not in a or "prompt_tokens" not in b or not requests:
        return {"prompt_tokens_per_request": None, "prefilled_tokens_per_request": None}
    return {"prompt_tokens_per_request": (a["prompt_tokens"] - b["prompt_tokens"]) / requests,
            "prefilled_tokens_per_request": (a["prefilled_tokens"] - b["prefilled_tokens"]) / requests}


def codec_figures(before: dict | None, after: dict | None) -> dict[str, float | None]:
    """Frames decoded per frame emitted and decode ms per emitted frame between two /v1/stats snapshots."""
    b, a = (before or {}).get("codec"), (after or {}).get("codec")
    if not a or not b:
        return {"decoded_per_emitted": None, "codec_ms_per_frame": None}
    emitted = a["frames_emitted"] - b["frames_emitted"]
    return {
        "decoded_per_emitted": (a["frames_decoded"] - b["frames_decoded"]) / emitted if emitted else None,
        "codec_ms_per_frame": 1000 * (a["decode_s"] - b["decode_s"]) / emitted if emitted else None,
    }


def cost_figures(before: dict | None, after: dict | None, audio_s: float) -> dict[str, Any]:
    """``cpu_s_per_audio_s``: the server's CPU seconds per second of audio it delivered between two
    /v1/stats snapshots, by part (model, sampling, codec, encoding; the rest: everything else the
    process did), from its ``cpu_seconds`` (lyre.cpu). None without them (an older server, or one
    behind a balancer)."""
    b, a = (before or {}).get("cpu_seconds"), (after or {}).get("cpu_seconds")
    if not a or not b or audio_s <= 0:
        return {"cpu_s_per_audio_s": None}
    spent = {k: a[k] - b[k] for k in a if k in b}
    parts = {k: v / audio_s for k, v in spent.items() if k != "process"}
    total = spent["process"] / audio_s
    return {"cpu_s_per_audio_s": {**parts, "rest": max(0.0, total - sum(parts.values())), "total": total}}


def summarize(results: list[RequestResult], wall_s: float, before: dict | None, after: dict | None) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttfb = [r.ttfb_ms for r in ok if r.ttfb_ms is not None]
    rtfs = [r.rtf for r in ok if r.rtf is not None]
    tokens = (after["total_tokens"] - before["total_tokens"]) if before and after else None
    return {
        "requests": len(results),
        "success_rate": len(ok) / len(results) if results else 0.0,
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "ttfb_ms_p50": percentile(ttfb, 0.50),
        "ttfb_ms_p95": percentile(ttfb, 0.95),
        "ttfb_ms_p99": percentile(ttfb, 0.99),
        "rtf_p50": percentile(rtfs, 0.50),
        **underrun_figures([r.underruns for r in ok]),
        "audio_s_per_wall_s": sum(r.audio_s for r in ok) / wall_s if wall_s else 0.0,
        "server_tokens_per_s": tokens / wall_s if tokens is not None and wall_s else None,
        **codec_figures(before, after),
        **cost_figures(before, after, sum(r.audio_s for r in ok)),
        **prompt_figures(before, after, len(results)),
        "wall_s": wall_s,
        "per_request": [asdict(r) for r in results],
    }


def underrun_figures(underruns: list[int | None]) -> dict[str, Any]:
    """Underrun totals; all None when any stream's were not measured (an encoded format)."""
    if any(u is None for u in underruns):
        return {"underruns": None, "streams_without_underrun": None, "real_time_streams": None}
    return {"underruns": sum(underruns),
            "streams_without_underrun": (sum(u == 0 for u in underruns) / len(underruns)) if underruns else 0.0,
            "real_time_streams": sum(u == 0 for u in underruns)}


def combined(stats: list[dict | None]) -> dict | None:
    """The replicas' /v1/stats added up (the counters the figures use)."""
    if not stats or any(s is None for s in stats):
        return None
    out = {"total_tokens": sum(s["total_tokens"] for s in stats)}
    engine = {k: sum(s["engine"].get(k, 0) for s in stats) for k in ("prompt_tokens", "prefilled_tokens")}
    codec = {k: sum(s["codec"].get(k, 0) for s in stats) for k in ("frames_decoded", "frames_emitted", "decode_s")}
    return {**out, "engine": engine, "codec": codec}


def per_replica(urls: list[str], before: list[dict | None], after: list[dict | None], wall: float) -> list[dict]:
    """Each replica's share of a measurement: sessions it took, tokens it generated."""
    rows = []
    for url, b, a in zip(urls, before, after, strict=True):
        if a is None or b is None:
            rows.append({"url": url, "error": "no /v1/stats"})
            continue
        sessions = a["scheduler"]["total_sessions"] - b["scheduler"]["total_sessions"]
        tokens = a["total_tokens"] - b["total_tokens"]
        rows.append({"url": url, "sessions": sessions, "tokens": tokens, "tokens_per_s": tokens / wall if wall else 0.0,
                     "active_sessions_after": a["scheduler"]["active_sessions"]})
    return rows


def parse_slo(text: str) -> dict[str, float]:
    """``"success=1.0,ttfb_p95_ms=300,underruns=0"`` -> {name: bound}."""
    allowed = {"success", "ttfb_p50_ms", "ttfb_p95_ms", "ttfb_p99_ms", "underruns", "real_time_share"}
    slo = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name not in allowed:
            raise ValueError(f"--slo: {part!r} must be name=value with name in {', '.join(sorted(allowed))}")
        try:
            slo[name] = float(value)
        except ValueError:
            raise ValueError(f"--slo: {part!r} needs a number") from None
    return slo


def meets(summary: dict[str, Any], slo: dict[str, float]) -> bool:
    checks = {
        "success": lambda b: summary["success_rate"] >= b,
        "ttfb_p50_ms": lambda b: summary["ttfb_ms_p50"] is not None and summary["ttfb_ms_p50"] <= b,
        "ttfb_p95_ms": lambda b: summary["ttfb_ms_p95"] is not None and summary["ttfb_ms_p95"] <= b,
        "ttfb_p99_ms": lambda b: summary["ttfb_ms_p99"] is not None and summary["ttfb_ms_p99"] <= b,
        "underruns": lambda b: summary["underruns"] <= b,
        "real_time_share": lambda b: summary["streams_without_underrun"] >= b,
    }
    return all(checks[name](bound) for name, bound in slo.items())


def find_max(measure, slo: dict[str, float], hi: int,
             known: dict[int, dict[str, Any]] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """The largest concurrency in 1..hi meeting ``slo`` (bisection; 0 when even 1 fails). ``known``:
    levels measured already (a sweep's), not measured again."""
    tried: dict[int, dict[str, Any]] = {n: {**summary, "meets_slo": meets(summary, slo)}
                                        for n, summary in (known or {}).items()}

    def ok(n: int) -> bool:
        if n not in tried:
            tried[n] = measure(n)
            tried[n]["meets_slo"] = meets(tried[n], slo)
        return tried[n]["meets_slo"]

    if not ok(1):
        return 0, [tried[k] for k in sorted(tried)]
    lo = 1
    if ok(hi):
        return hi, [tried[k] for k in sorted(tried)]
    while hi - lo > 1:  # ok(lo) and not ok(hi)
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, [tried[k] for k in sorted(tried)]
