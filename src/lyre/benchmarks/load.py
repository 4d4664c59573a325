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
from pathlib import Path
from typing import Any

from lyre.benchmarks.figures import RequestResult, combined, per_replica, summarize
from lyre.model.sample_texts import TEXT_SETS

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






# --------------------------------------------------------------------------------------------
# service-level objectives






