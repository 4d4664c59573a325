"""One request over REST, WebSocket or gRPC that may misbehave on purpose (the reliability suite).

``behaviour``: ``complete`` (read everything and count the bytes), ``disconnect`` (go away at
``at``: before the first byte, mid-stream, or — WebSocket — mid-context, with the text unfinished)
or ``cancel`` (a WebSocket cancel message, a gRPC call cancel; REST has none, so it disconnects).
Each returns an :class:`Outcome`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from dataclasses import dataclass

import aiohttp
import grpc
import websockets

from lyre.v1 import tts_pb2, tts_pb2_grpc


@dataclass
class Outcome:
    protocol: str
    behaviour: str
    result: str  # complete | short | disconnected | cancelled | refused | error
    audio_bytes: int = 0
    status: str = ""  # HTTP status, gRPC code or WebSocket error code of a failure
    message: str = ""
    retry_after: str | None = None
    latency_ms: float = 0.0  # to the answer (first audio, or the refusal)


def _ws_url(http: str) -> str:
    return http.replace("http://", "ws://") + "/v1/audio/stream"


@dataclass
class Shared:
    """One HTTP session (unlimited pool) and one gRPC channel for many requests: a burst of hundreds
    of clients from one process then costs little besides the requests themselves."""

    http: aiohttp.ClientSession | None = None
    channel: grpc.aio.Channel | None = None

    @classmethod
    async def open(cls, grpc_target: str) -> Shared:
        return cls(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)),
                   grpc.aio.insecure_channel(grpc_target))

    async def close(self) -> None:
        await self.http.close()
        await self.channel.close()


def _own_or_shared(make_own, shared):
    return contextlib.nullcontext(shared) if shared is not None else make_own()


async def rest(http: str, text: str, behaviour: str, at: int, expected: int, options: dict | None = None,
               shared: Shared | None = None) -> Outcome:
    start = time.perf_counter()
    options = options or {}
    sse = options.get("stream_format") == "sse"
    body = {"input": text, "response_format": "pcm", **options}
    got, error = 0, None
    async with _own_or_shared(aiohttp.ClientSession, shared and shared.http) as s:
        r = await s.post(http + "/v1/audio/speech", json=body)
        latency = 1000 * (time.perf_counter() - start)
        if r.status != 200:
            payload = await r.json()
            result = "refused" if r.status == 429 else "error"
            return Outcome("rest", behaviour, result, 0, str(r.status), payload["error"]["message"],
                           r.headers.get("Retry-After"), latency)
        if behaviour != "complete" and at == 0:
            r.close()
            return Outcome("rest", behaviour, "disconnected", 0, latency_ms=latency)
        chunks = 0
        try:
            async for data in r.content.iter_any():
                if sse:
                    for line in data.decode().splitlines():
                        if line.startswith("data: "):
                            event = json.loads(line[6:])
                            if event["type"] == "speech.audio.delta":
                                got += len(base64.b64decode(event["audio"]))
                            elif event["type"] == "error":
                                error = event["error"]
                else:
                    got += len(data)
                chunks += 1
                if behaviour != "complete" and chunks >= at:
                    r.close()
                    return Outcome("rest", behaviour, "disconnected", got, latency_ms=latency)
        except aiohttp.ClientPayloadError as e:
            return Outcome("rest", behaviour, "short", got, "cut", str(e), latency_ms=latency)
    if error is not None:
        return Outcome("rest", behaviour, "error", got, error["code"], error["message"], latency_ms=latency)
    return Outcome("rest", behaviour, "complete" if got == expected else "short", got, latency_ms=latency)


async def websocket(http: str, text: str, behaviour: str, at: int, expected: int, options: dict | None = None
                    ) -> Outcome:
    start = time.perf_counter()
    got, latency = 0, 0.0
    async with websockets.connect(_ws_url(http), max_size=None) as ws:
        mid_context = behaviour != "complete" and at < 0  # go away with the text unfinished
        await ws.send(json.dumps({"context_id": "c", "append": text + " ", **(options or {})}))
        if mid_context:
            return Outcome("ws", behaviour, "disconnected")
        await ws.send(json.dumps({"context_id": "c", "end": True}))
        if behaviour == "disconnect" and at == 0:
            return Outcome("ws", behaviour, "disconnected")
        chunks = 0
        async for raw in ws:
            message = json.loads(raw)
            if message.get("type") == "audio":
                latency = latency or 1000 * (time.perf_counter() - start)
                got += len(base64.b64decode(message["audio"]))
                chunks += 1
                if behaviour == "disconnect" and chunks >= at:
                    return Outcome("ws", behaviour, "disconnected", got, latency_ms=latency)
                if behaviour == "cancel" and chunks >= at:
                    await ws.send(json.dumps({"context_id": "c", "cancel": True}))
            elif message.get("cancelled"):
                return Outcome("ws", behaviour, "cancelled", got, latency_ms=latency)
            elif "error" in message:
                e = message["error"]
                result = "refused" if e["code"] == "overloaded" else "error"
                return Outcome("ws", behaviour, result, got, e["code"], e["message"], latency_ms=latency)
            elif message.get("done"):
                return Outcome("ws", behaviour, "complete" if got == expected else "short", got, latency_ms=latency)
    return Outcome("ws", behaviour, "short", got, "closed", "the socket closed before done", latency_ms=latency)


async def grpc_stream(target: str, text: str, behaviour: str, at: int, expected: int, options: dict | None = None,
                      shared: Shared | None = None) -> Outcome:
    start = time.perf_counter()
    got, latency = 0, 0.0
    async with _own_or_shared(lambda: grpc.aio.insecure_channel(target), shared and shared.channel) as channel:
        request = tts_pb2.SynthesizeRequest(text=text, sampling=tts_pb2.SamplingOptions(**(options or {})))
        call = tts_pb2_grpc.TextToSpeechStub(channel).SynthesizeStream(request)
        chunks = 0
        try:
            async for chunk in call:
                latency = latency or 1000 * (time.perf_counter() - start)
                got += len(chunk.audio)
                chunks += 1
                if behaviour != "complete" and chunks >= max(1, at):
                    call.cancel()
                    return Outcome("grpc", behaviour, "cancelled" if behaviour == "cancel" else "disconnected",
                                   got, latency_ms=latency)
        except grpc.aio.AioRpcError as e:
            latency = latency or 1000 * (time.perf_counter() - start)
            code = e.code()
            result = "refused" if code == grpc.StatusCode.RESOURCE_EXHAUSTED else "error"
            return Outcome("grpc", behaviour, result, got, code.name, e.details() or "", latency_ms=latency)
    return Outcome("grpc", behaviour, "complete" if got == expected else "short", got, latency_ms=latency)


async def one(protocol: str, http: str, grpc_target: str, text: str, behaviour: str, at: int,
              expected: int, options: dict | None = None, shared: Shared | None = None) -> Outcome:
    """``options``: request fields (sampling; for REST also e.g. ``stream_format``)."""
    try:
        if protocol == "rest":
            return await rest(http, text, behaviour, at, expected, options, shared)
        sampling = {k: v for k, v in (options or {}).items() if k in tts_pb2.SamplingOptions.DESCRIPTOR.fields_by_name}
        if protocol == "ws":
            return await websocket(http, text, behaviour, at, expected, sampling)
        return await grpc_stream(grpc_target, text, behaviour, at, expected, sampling, shared)
    except (aiohttp.ClientError, websockets.WebSocketException, OSError, asyncio.TimeoutError) as e:
        return Outcome(protocol, behaviour, "error", 0, type(e).__name__, str(e))
