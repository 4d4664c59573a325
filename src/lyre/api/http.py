"""REST and WebSocket front end (aiohttp). Parses, validates, encodes audio; no model logic.

- ``POST /v1/audio/speech``: OpenAI-compatible (``model``, ``input`` or ``text``, ``voice``,
  ``response_format``, ``speed``, ``stream_format`` audio|sse) plus ``sample_rate``, ``mulaw``/``alaw``
  formats and sampling overrides; audio streams from the first chunk.
- ``GET /v1/voices``, ``/v1/stats``, ``/health``, ``/metrics``.
- ``GET /v1/audio/stream`` (WebSocket): seed 004's exchange plus contexts, incremental text, cancel.

Errors are JSON ``{"error": {"message", "type", "code"}}`` with a fitting 4xx/5xx status.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import Any

from aiohttp import WSMsgType, web

from lyre.api.common import IncrementalText, InFlight, OutOfRange, classify, error_code, sampling_options
from lyre.audio import AudioEncoder, AudioFormatError
from lyre.service import InvalidRequest, LyreError, SpeechStream, TTSService

log = logging.getLogger("lyre.http")

SERVICE = web.AppKey("service", TTSService)
INFLIGHT = web.AppKey("inflight", InFlight)


def error_response(status: int, message: str, type_: str, code: str, headers: dict | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type_, "code": code}}, status=status,
                             headers=headers)


def lyre_error_response(e: Exception) -> web.Response:
    info = classify(e)
    headers = {"Retry-After": str(max(1, round(e.retry_after_s)))} if hasattr(e, "retry_after_s") else None
    return error_response(info.http_status, str(e), info.type, error_code(e), headers)


@web.middleware
async def errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except (LyreError, AudioFormatError) as e:
        return lyre_error_response(e)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(e.status, "http_error")
        message = e.text if e.status != 413 else (
            f"request body is larger than server.max_body_bytes ({request.app['max_body']} bytes)")
        return error_response(e.status, message, "invalid_request_error", code)


def auth_middleware(api_key: str | None):
    @web.middleware
    async def middleware(request: web.Request, handler):
        if api_key and request.path.startswith("/v1/"):
            given = request.headers.get("Authorization", "")
            if given != f"Bearer {api_key}" and request.query.get("api_key") != api_key:
                return error_response(401, "missing or wrong API key (Authorization: Bearer <key>)",
                                      "authentication_error", "unauthorized")
        return await handler(request)

    return middleware


def create_app(service: TTSService, inflight: InFlight) -> web.Application:
    cfg = service.config.server
    app = web.Application(client_max_size=cfg.max_body_bytes,
                          middlewares=[errors_middleware, auth_middleware(cfg.api_key)])
    app[SERVICE] = service
    app[INFLIGHT] = inflight
    app["max_body"] = cfg.max_body_bytes
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/stream", websocket)
    app.router.add_get("/v1/voices", voices)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


# --------------------------------------------------------------------------------------------
# REST


async def _json_body(request: web.Request) -> dict[str, Any]:
    limit = request.app["max_body"]
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def _string(body: dict, name: str, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise InvalidRequest(f"'{name}' is required")
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string, got {type(value).__name__}")
    return value


def _draining(request: web.Request) -> None:
    if request.app[INFLIGHT].draining:
        raise web.HTTPServiceUnavailable(text="the server is shutting down")


async def speech(request: web.Request) -> web.StreamResponse:
    _draining(request)
    service = request.app[SERVICE]
    body = await _json_body(request)
    text = _string(body, "input") if "input" in body else _string(body, "text", required=True)
    if text is None:
        raise InvalidRequest("'input' is required")
    _string(body, "model")
    voice = _string(body, "voice")
    fmt = _string(body, "response_format") or ("mp3" if "input" in body else "wav")
    speed = body.get("speed", 1.0)
    if speed is not None:
        if isinstance(speed, bool) or not isinstance(speed, (int, float)):
            raise InvalidRequest(f"'speed' must be a number, got {speed!r}")
        if not 0.25 <= speed <= 4.0:
            raise OutOfRange(f"'speed' = {speed} is out of range [0.25, 4]")
        if speed != 1.0:
            raise OutOfRange(f"'speed' = {speed} is not supported: Lyre speaks at speed 1.0 only")
    stream_format = _string(body, "stream_format") or "audio"
    if stream_format not in ("audio", "sse"):
        raise OutOfRange(f"'stream_format' must be 'audio' or 'sse', got {stream_format!r}")
    sample_rate = body.get("sample_rate")
    if sample_rate is not None and (isinstance(sample_rate, bool) or not isinstance(sample_rate, int)):
        raise InvalidRequest(f"'sample_rate' must be an integer, got {sample_rate!r}")
    encoder = AudioEncoder(fmt, sample_rate)
    stream = service.stream(text, voice, **sampling_options(body))
    with request.app[INFLIGHT]:
        try:
            # Wait for the first chunk before answering, so an early failure still gets its status.
            first = await stream.__anext__()
        except StopAsyncIteration:
            first = None
        headers = {"Content-Type": "text/event-stream" if stream_format == "sse" else encoder.content_type,
                   "X-Sample-Rate": str(encoder.sample_rate), "Cache-Control": "no-cache"}
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        try:
            chunks = ([first] if first is not None else [])
            await _send_audio(resp, encoder, chunks, stream_format)
            async for chunk in stream:
                await _send_audio(resp, encoder, [chunk], stream_format)
            tail = encoder.finish()
            if stream_format == "sse":
                if tail:
                    await _sse(resp, {"type": "speech.audio.delta", "audio": base64.b64encode(tail).decode()})
                m = stream.metrics or {}
                usage = {"input_tokens": m.get("prompt_tokens", 0), "output_tokens": m.get("tokens", 0)}
                usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
                await _sse(resp, {"type": "speech.audio.done", "usage": usage, "metrics": m})
            elif tail:
                await resp.write(tail)
        except LyreError as e:  # failed mid-stream: the status is sent; say so and end the body
            log.warning("stream failed after it started: %s", e)
            if stream_format == "sse":
                info = classify(e)
                await _sse(resp, {"type": "error", "error": {"message": str(e), "type": info.type,
                                                             "code": error_code(e)}})
            else:  # cut the body short so the client sees an incomplete response, not a short file
                if request.transport is not None:
                    request.transport.close()
                return resp
        finally:
            await stream.aclose()  # a client that went away cancels the synthesis
        await resp.write_eof()
        return resp


async def _send_audio(resp: web.StreamResponse, encoder: AudioEncoder, chunks: list, stream_format: str) -> None:
    for chunk in chunks:
        data = encoder.encode(chunk.pcm)
        if not data:
            continue
        if stream_format == "sse":
            await _sse(resp, {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
        else:
            await resp.write(data)


async def _sse(resp: web.StreamResponse, event: dict) -> None:
    await resp.write(f"data: {json.dumps(event)}\n\n".encode())


async def voices(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response({"voices": [{"name": v} for v in service.voices],
                              "default": service.config.model.default_voice})


async def stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICE].stats())


async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    ready = service.ready and not request.app[INFLIGHT].draining
    body = {"status": "ok" if ready else ("draining" if request.app[INFLIGHT].draining else "unavailable"),
            "model": service.model.source if service.model else None,
            "demo": bool(service.model and service.model.is_demo)}
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[SERVICE].metrics.exposition(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


# --------------------------------------------------------------------------------------------
# WebSocket


class WsContext:
    """One utterance on a socket: its options, incremental text, and the streams speaking it, in
    order. Pieces start synthesising as soon as they are complete (pipelined); audio goes out in
    order."""

    def __init__(self, ws: web.WebSocketResponse, send_lock: asyncio.Lock, service: TTSService, cid: str | None,
                 first: dict):
        self.ws, self.send_lock, self.service, self.cid = ws, send_lock, service, cid
        self.voice = _string(first, "voice")
        fmt = _string(first, "response_format") or _string(first, "format") or "pcm"
        rate = first.get("sample_rate")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int)):
            raise InvalidRequest(f"'sample_rate' must be an integer, got {rate!r}")
        self.encoder = AudioEncoder(fmt, rate)
        self.sampling = sampling_options(first)
        self.text = IncrementalText()
        self.streams: asyncio.Queue[SpeechStream | None] = asyncio.Queue()
        self.started = asyncio.get_running_loop().time()
        self.first_audio: float | None = None
        self.totals = {"tokens": 0, "audio_seconds": 0.0, "chunks": 0, "late_chunks": 0}
        self.sequence = 0
        self.ended = False
        self.task = asyncio.create_task(self._pump())

    def speak(self, pieces: list[str]) -> None:
        for piece in pieces:
            self.streams.put_nowait(self.service.stream(piece, self.voice, **self.sampling))

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.speak(self.text.flush())
            self.streams.put_nowait(None)

    async def cancel(self) -> None:
        self.ended = True
        self.task.cancel()
        while not self.streams.empty():
            s = self.streams.get_nowait()
            if s is not None:
                s.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass

    async def _pump(self) -> None:
        current: SpeechStream | None = None
        try:
            while (current := await self.streams.get()) is not None:
                async for chunk in current:
                    self.totals["audio_seconds"] += chunk.seconds
                    await self._send(self.encoder.encode(chunk.pcm))
                for key in ("tokens", "chunks", "late_chunks"):
                    self.totals[key] += (current.metrics or {}).get(key, 0)
            await self._send(self.encoder.finish())
            ttfb = None if self.first_audio is None else 1000 * (self.first_audio - self.started)
            await self._json({"done": True, "metrics": {"ttfb_ms": ttfb, **self.totals}})
        except LyreError as e:
            await self._json({"error": _error_body(e)})
        except (ConnectionResetError, RuntimeError):  # the socket went away
            pass
        finally:  # whatever ended the pump, nothing it started keeps a slot
            if current is not None:
                current.cancel()
            while not self.streams.empty():
                queued = self.streams.get_nowait()
                if queued is not None:
                    queued.cancel()

    async def _send(self, data: bytes) -> None:
        if not data:
            return
        if self.first_audio is None:
            self.first_audio = asyncio.get_running_loop().time()
        async with self.send_lock:  # contexts share the socket: one frame at a time
            if self.cid is None:
                await self.ws.send_bytes(data)
            else:
                await self.ws.send_json({"type": "audio", "context_id": self.cid, "sequence": self.sequence,
                                         "audio": base64.b64encode(data).decode()})
        self.sequence += 1

    async def _json(self, message: dict) -> None:
        if self.cid is not None:
            message["context_id"] = self.cid
        async with self.send_lock:
            if not self.ws.closed:
                await self.ws.send_json(message)


def _error_body(e: Exception) -> dict:
    return {"message": str(e), "type": classify(e).type, "code": error_code(e)}


async def websocket(request: web.Request) -> web.WebSocketResponse:
    _draining(request)
    service = request.app[SERVICE]
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=request.app["max_body"], compress=False)
    await ws.prepare(request)
    contexts: dict[str | None, WsContext] = {}
    send_lock = asyncio.Lock()
    with request.app[INFLIGHT]:
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    if msg.type == WSMsgType.BINARY:
                        async with send_lock:
                            await ws.send_json({"error": {"message": "send JSON text messages", "type":
                                                      "invalid_request_error", "code": "invalid_message"}})
                    continue
                await _ws_message(ws, send_lock, service, contexts, msg.data)
        except Exception:  # never let an error out of a prepared socket (it would write HTTP onto it)
            log.exception("websocket handler failed")
            await ws.close(code=1011, message=b"internal error")
        finally:
            for c in contexts.values():  # a closed socket cancels everything it started
                await c.cancel()
    return ws


async def _ws_message(ws, send_lock: asyncio.Lock, service: TTSService, contexts: dict, raw: str) -> None:
    async def reply(message: dict) -> None:
        async with send_lock:
            await ws.send_json(message)

    try:
        message = json.loads(raw)
    except ValueError as e:
        message = f"message is not valid JSON: {e}"
    if not isinstance(message, dict):
        text = message if isinstance(message, str) else "each message must be a JSON object"
        await reply({"error": {"message": text, "type": "invalid_request_error", "code": "invalid_request"}})
        return
    cid = message.get("context_id")
    if cid is not None and not isinstance(cid, str):
        await reply({"error": {"message": "'context_id' must be a string", "type": "invalid_request_error",
                                      "code": "invalid_request"}})
        return
    try:
        ctx = contexts.get(cid)
        if message.get("cancel"):
            if ctx is not None:
                await ctx.cancel()
                del contexts[cid]
            await reply({"done": True, "cancelled": True, **({"context_id": cid} if cid else {})})
            return
        if ctx is None or ctx.ended and ctx.task.done():
            ctx = contexts[cid] = WsContext(ws, send_lock, service, cid, message)
        if "append" in message:
            ctx.speak(ctx.text.append(_string(message, "append") or ""))
        if "text" in message:  # seed 004: the whole text as one utterance, then done
            ctx.speak(ctx.text.flush() + [_string(message, "text") or ""])
            ctx.end()
        if message.get("flush"):
            ctx.speak(ctx.text.flush())
        if message.get("end"):
            ctx.end()
    except (LyreError, AudioFormatError) as e:
        await reply({"error": _error_body(e), **({"context_id": cid} if cid else {})})
        bad = contexts.pop(cid, None)
        if bad is not None:
            await bad.cancel()
