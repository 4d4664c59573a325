"""Load against a running server: closed loop (N users back to back) or open loop (Poisson arrivals),
over REST, WebSocket or gRPC, measuring what matters for voice.

Per request: TTFB (request sent -> first audio byte), real-time factor (wall time / audio time) and
underruns of a simulated player that starts at the first byte (an underrun is a chunk that arrives
after the audio before it has finished playing). Audio is requested as 24 kHz PCM so its duration
is exact; over REST another ``response_format`` may be asked for (``--format``): TTFB is then the
first byte of the encoded body, the audio's duration comes from decoding the whole body, and
underruns are not measured (None).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TEXT_SETS = {
    "conversational": [
        "Hi, thanks for calling. How can I help you today?",
        "Sure, I can book that for you.",
        "Your order shipped this morning and should arrive on Thursday.",
        "Could you repeat the last four digits of your card, please?",
        "Great, you're all set. Is there anything else I can do for you?",
        "I'm sorry about the wait <sigh> we're a little busy right now.",
        "Let me check that for you, one moment.",
        "Yes, we're open until eight tonight.",
    ],
    "longform": [
        "The history of the lighthouse goes back more than two thousand years. The first ones were simple fires "
        "burning on hilltops, tended through the night so that ships could find their way home. Later, towers of "
        "stone carried the light higher, and mirrors and lenses sent it farther out to sea.",
        "Every morning the market wakes before the town does. Farmers arrive in the dark with crates of apples and "
        "bunches of herbs, bakers stack loaves still warm from the oven, and by the time the sun is up the square is "
        "full of voices, bargaining and laughing and calling out the prices of the day.",
        "When you start a new habit, make it small enough that you cannot fail. Read one page, walk for five "
        "minutes, write a single sentence. The point is not the size of the step but the fact that you take it "
        "every day, until it becomes part of who you are.",
    ],
}
SAMPLE_RATE = 24000
BYTES_PER_SECOND = 2 * SAMPLE_RATE


def load_texts(name_or_file: str) -> list[str]:
    if name_or_file in TEXT_SETS:
        return TEXT_SETS[name_or_file]
    path = Path(name_or_file)
    if not path.is_file():
        raise ValueError(f"--texts: {name_or_file!r} is neither a built-in set ({', '.join(TEXT_SETS)}) nor a file")
    texts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not texts:
        raise ValueError(f"--texts: {path} holds no text (one text per line)")
    return texts


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


class Player:
    """Simulated playback that starts at the first audio byte."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.first: float | None = None
        self.audio_s = 0.0
        self.underruns = 0

    def arrive(self, nbytes: int) -> None:
        now = time.perf_counter()
        if nbytes <= 0:
            return
        if self.first is None:
            self.first = now
        elif now > self.first + self.audio_s:
            self.underruns += 1
        self.audio_s += nbytes / BYTES_PER_SECOND

    def result(self) -> RequestResult:
        end = time.perf_counter()
        return RequestResult(ok=True, ttfb_ms=None if self.first is None else 1000 * (self.first - self.t0),
                             audio_s=self.audio_s, wall_s=end - self.t0, underruns=self.underruns)


class Target:
    """Where and how requests go."""

    def __init__(self, protocol: str, http_url: str | None, grpc_target: str | None, voice: str | None,
                 extra: dict[str, Any] | None = None, api_key: str | None = None, fmt: str = "pcm",
                 replicas: list[str] | None = None):
        """``replicas``: the servers behind a balancer at ``http_url``, each asked for its /v1/stats."""
        self.replicas = replicas or []
        if fmt != "pcm" and protocol != "rest":
            raise ValueError(f"--format {fmt} is for --protocol rest (WebSocket and gRPC load use PCM)")
        self.protocol, self.http, self.grpc, self.voice, self.format = protocol, http_url, grpc_target, voice, fmt
        self.extra = extra or {}
        self.api_key = api_key
        self._session = self._channel = None

    async def __aenter__(self) -> Target:
        if self.protocol == "rest":
            import aiohttp

            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        elif self.protocol == "grpc":
            import grpc

            self._channel = grpc.aio.insecure_channel(self.grpc)
        return self

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()
        if self._channel is not None:
            await self._channel.close()

    async def request(self, text: str) -> RequestResult:
        player = Player(time.perf_counter())
        try:
            await getattr(self, f"_{self.protocol}")(text, player)
        except Exception as e:  # any failure is a failed request, recorded with its message
            return RequestResult(ok=False, wall_s=time.perf_counter() - player.t0, error=f"{type(e).__name__}: {e}"[:300])
        result = player.result()
        if result.audio_s == 0:
            return RequestResult(ok=False, wall_s=result.wall_s, error="no audio")
        return result

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def _rest(self, text: str, player: Player) -> None:
        body = {"input": text, "response_format": self.format, **({"voice": self.voice} if self.voice else {}),
                **self.extra}
        encoded: list[bytes] = []
        async with self._session.post(self.http + "/v1/audio/speech", json=body, headers=self._headers()) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:200]}")
            async for chunk in r.content.iter_any():
                if self.format == "pcm":
                    player.arrive(len(chunk))
                else:
                    player.first = player.first or time.perf_counter()
                    encoded.append(chunk)
        if self.format in ("mulaw", "alaw"):  # raw G.711: a byte a sample, no header to decode
            player.audio_s = sum(map(len, encoded)) / int(r.headers["X-Sample-Rate"])
            player.underruns = None
        elif self.format != "pcm":
            player.audio_s = await asyncio.to_thread(decoded_seconds, b"".join(encoded))
            player.underruns = None

    async def _ws(self, text: str, player: Player) -> None:
        import websockets

        url = self.http.replace("http://", "ws://") + "/v1/audio/stream"
        async with websockets.connect(url, additional_headers=self._headers() or None, max_size=None) as ws:
            await ws.send(json.dumps({"text": text, **({"voice": self.voice} if self.voice else {}), **self.extra}))
            while True:
                msg = await ws.recv()
                if isinstance(msg, bytes):
                    player.arrive(len(msg))
                    continue
                data = json.loads(msg)
                if "error" in data:
                    raise RuntimeError(data["error"].get("message"))
                if data.get("done"):
                    return

    async def _grpc(self, text: str, player: Player) -> None:
        from lyre.v1 import tts_pb2, tts_pb2_grpc

        stub = tts_pb2_grpc.TextToSpeechStub(self._channel)
        sampling = tts_pb2.SamplingOptions(**{k: v for k, v in self.extra.items() if k in
                                              ("temperature", "top_p", "top_k", "repetition_penalty", "max_tokens",
                                               "seed")})
        req = tts_pb2.SynthesizeRequest(text=text, voice=self.voice or "", sampling=sampling)
        metadata = (("authorization", f"Bearer {self.api_key}"),) if self.api_key else None
        async for chunk in stub.SynthesizeStream(req, metadata=metadata):
            player.arrive(len(chunk.audio))


def decoded_seconds(data: bytes) -> float:
    """The duration of an encoded audio file (PyAV)."""
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        return sum(frame.samples for frame in container.decode(stream)) / stream.rate


def server_stats(http_url: str | None, api_key: str | None = None) -> dict[str, Any] | None:
    if not http_url:
        return None
    req = urllib.request.Request(http_url + "/v1/stats",
                                 headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    except OSError:
        return None


async def closed_loop(target: Target, users: int, requests: int, texts: list[str], progress) -> list[RequestResult]:
    """``users`` clients, each sending its next request when the last ends, ``requests`` in all."""
    results: list[RequestResult] = []
    counter = iter(range(requests))

    async def user() -> None:
        for i in counter:
            results.append(await target.request(texts[i % len(texts)]))
            progress(1)

    await asyncio.gather(*(user() for _ in range(users)))
    return results


async def open_loop(target: Target, rps: float, requests: int, texts: list[str], progress, seed: int = 0
                    ) -> list[RequestResult]:
    """Poisson arrivals at ``rps`` requests per second, ``requests`` in all."""
    rng = random.Random(seed)
    results: list[RequestResult] = []

    async def one(i: int) -> None:
        results.append(await target.request(texts[i % len(texts)]))
        progress(1)

    tasks = []
    start = time.perf_counter()
    t = 0.0
    for i in range(requests):
        t += rng.expovariate(rps)
        delay = start + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # the arrival schedule itself
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return results


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


def run_level(target: Target, mode: str, level: float, requests: int, texts: list[str], desc: str
              ) -> dict[str, Any]:
    """One measurement: closed loop with ``level`` users or open loop at ``level`` rps."""
    from tqdm import tqdm

    async def go() -> tuple[list[RequestResult], float, dict | None, dict | None]:
        before = await asyncio.to_thread(server_stats, target.http, target.api_key)
        spread_before = [await asyncio.to_thread(server_stats, url, target.api_key) for url in target.replicas]
        with tqdm(total=requests, desc=desc, unit="req", leave=False) as bar:
            async with target:
                t0 = time.perf_counter()
                if mode == "closed":
                    results = await closed_loop(target, int(level), requests, texts, bar.update)
                else:
                    results = await open_loop(target, level, requests, texts, bar.update)
                wall = time.perf_counter() - t0
        after = await asyncio.to_thread(server_stats, target.http, target.api_key)
        spread = [await asyncio.to_thread(server_stats, url, target.api_key) for url in target.replicas]
        if target.replicas:  # the balancer's /v1/stats is one replica's: the figures are the replicas' sum
            before, after = combined(spread_before), combined(spread)
            replica_load[:] = per_replica(target.replicas, spread_before, spread, wall)
        return results, wall, before, after

    replica_load: list[dict[str, Any]] = []
    results, wall, before, after = asyncio.run(go())
    summary = summarize(results, wall, before, after)
    summary["concurrency" if mode == "closed" else "rps"] = level
    if replica_load:
        summary["replicas"] = replica_load
    return summary


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


# --------------------------------------------------------------------------------------------
# service-level objectives


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


def find_max(measure, slo: dict[str, float], hi: int) -> tuple[int, list[dict[str, Any]]]:
    """The largest concurrency in 1..hi meeting ``slo`` (bisection; 0 when even 1 fails)."""
    tried: dict[int, dict[str, Any]] = {}

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
