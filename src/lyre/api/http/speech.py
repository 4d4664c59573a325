"""``POST /v1/audio/speech``: OpenAI's speech endpoint (``model``, ``input`` or ``text``, ``voice``,
``response_format``, ``speed``, ``stream_format`` audio|sse, ``instructions`` and ``language`` (as the model family takes them);
with sse, ``timestamps``: a ``speech.audio.timestamps`` event after each text piece's audio)
plus ``sample_rate``, ``mulaw``/``alaw`` and sampling overrides (:class:`lyre.service.options.SpeechBody`).
Audio streams from the first chunk, except FLAC, which is sent whole so that its header holds its
length (libsndfile cannot read a FLAC file without it)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging

from aiohttp import web

from lyre.api.common import cancelled_by_drain, describe_text, encode, error_body, finish, whole_audio
from lyre.api.http.shared import ACCOUNT, INFLIGHT, SERVICE, draining, json_body
from lyre.audio.formats import AudioEncoder, check_bitrate, check_format
from lyre.errors import InvalidRequest, LyreError
from lyre.service.options import SpeechBody, parse
from lyre.service.stream import SpeechStream
from lyre.service.utterance import Utterance

log = logging.getLogger("lyre.http")


async def speech(request: web.Request) -> web.StreamResponse:
    draining(request)
    service = request.app[SERVICE]
    body = parse(SpeechBody, await json_body(request))
    if body.input is not None and body.text is not None:
        raise InvalidRequest("give 'input' (OpenAI's name) or 'text', not both")
    text = body.input if body.input is not None else body.text
    if text is None:
        raise InvalidRequest("'input' is required")
    if body.timestamps is not None and body.stream_format != "sse":
        raise InvalidRequest("'timestamps' come as events of stream_format 'sse' (a plain audio response has no "
                             "place for them)")
    fmt = body.response_format or ("mp3" if body.input is not None else "wav")
    check_bitrate(fmt, check_format(fmt, body.sample_rate), body.bitrate)  # refused before admission
    account = request[ACCOUNT]
    voice = await service.voices.resolve(body.voice, account)
    stream = service.speak(text, voice, account=account, protocol="rest", tempo=body.speed or 1.0, **body.options())
    log.debug("speech: %s, %s", describe_text(text), fmt)
    with request.app[INFLIGHT].request():
        if fmt == "flac" and body.stream_format != "sse":
            return await _respond_whole(request, stream, fmt, body)
        return await _respond(request, stream, fmt, body)


async def _respond_whole(request: web.Request, stream: SpeechStream, fmt: str, body: SpeechBody) -> web.Response:
    """The whole file in one response, its headers filled in (a failure still gets its status)."""
    try:
        encoder = AudioEncoder(fmt, body.sample_rate, speed=body.speed or 1.0, stream=False,
                               mark=request.app[SERVICE].marker(), bitrate=body.bitrate)
    except BaseException:
        await stream.aclose()
        raise
    try:
        data = await whole_audio(stream, encoder, gone=lambda: request.transport is None or
                                 request.transport.is_closing())
    except asyncio.CancelledError:
        error = cancelled_by_drain(request.app[INFLIGHT])
        if error is None:
            raise
        raise error from None
    except ConnectionResetError:  # the client left: its synthesis has been cancelled
        log.debug("speech: the client disconnected before its %s file was complete", fmt)
        return web.Response(status=499)
    return web.Response(body=data, headers={"Content-Type": encoder.content_type, "Cache-Control": "no-cache",
                                            "X-Sample-Rate": str(encoder.sample_rate)})


async def _respond(request: web.Request, stream: SpeechStream | Utterance, fmt: str, body: SpeechBody) -> web.StreamResponse:
    """Stream ``stream`` as the response. Every path ends the synthesis and releases the encoder."""
    sse = body.stream_format == "sse"
    resp: web.StreamResponse | None = None
    encoder: AudioEncoder | None = None
    try:
        # Wait for the first chunk before answering, so an early failure still gets its status.
        first = await anext(stream, None)
        encoder = AudioEncoder(fmt, body.sample_rate, speed=body.speed or 1.0, bitrate=body.bitrate,
                               mark=request.app[SERVICE].marker())  # marked again after a tempo change
        headers = {"Content-Type": "text/event-stream" if sse else encoder.content_type,
                   "X-Sample-Rate": str(encoder.sample_rate), "Cache-Control": "no-cache"}
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        if first is not None:
            await _send(resp, await encode(encoder, first.pcm), sse)
            await _timestamps(resp, stream, body, encoder)
        async for chunk in stream:
            await _send(resp, await encode(encoder, chunk.pcm), sse)
            await _timestamps(resp, stream, body, encoder)
        await _send(resp, await finish(encoder), sse)
        await _timestamps(resp, stream, body, encoder)  # (the last piece ends with the stream)
        if sse:
            m = stream.metrics
            usage = {"input_tokens": m.prompt_tokens if m else 0, "output_tokens": m.tokens if m else 0}
            usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
            await _sse(resp, {"type": "speech.audio.done", "usage": usage, "metrics": m.as_dict() if m else {}})
        await resp.write_eof()
        return resp
    except (LyreError, asyncio.CancelledError) as e:
        error = e if isinstance(e, LyreError) else cancelled_by_drain(request.app[INFLIGHT])
        if error is None:  # cancelled, not by the drain: nothing to tell anyone
            raise
        if resp is None:  # nothing sent yet: the status says it
            raise error from None
        # failed mid-stream: the status is sent; say so and end the body
        log.warning("speech stream ended early: %s", error)
        if sse:
            with contextlib.suppress(ConnectionResetError):
                await _sse(resp, {"type": "error", "error": error_body(error)})
        elif request.transport is not None:  # cut the body: an incomplete response, not a short file
            request.transport.close()
        return resp
    except ConnectionResetError:  # the client went away (its synthesis is cancelled below)
        log.debug("speech stream: the client disconnected")
        return resp
    finally:
        await stream.aclose()
        if encoder is not None:
            encoder.close()


async def _send(resp: web.StreamResponse, data: bytes, sse: bool) -> None:
    if not data:
        return
    if sse:
        await _sse(resp, {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    else:
        await resp.write(data)


async def _timestamps(resp: web.StreamResponse, stream: SpeechStream | Utterance, body: SpeechBody,
                      encoder: AudioEncoder) -> None:
    """A speech.audio.timestamps event for each text piece whose audio has been encoded and sent (its times
    at the response's speed and sample rate)."""
    if stream.timeline is None:
        return
    for piece in stream.timeline.take():
        if body.timestamps is not None:
            await _sse(resp, {"type": "speech.audio.timestamps",
                              **piece.as_dict(body.timestamps, body.speed or 1.0, encoder.sample_rate)})


async def _sse(resp: web.StreamResponse, event: dict) -> None:
    await resp.write(f"data: {json.dumps(event)}\n\n".encode())
