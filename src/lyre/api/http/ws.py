"""WebSocket front end: ``GET /v1/audio/stream``. Translates messages into :class:`~lyre.service.utterance.Utterance`
calls and their audio into frames; the utterance owns text splitting, ordering and admission.

Each message is one JSON object (:class:`lyre.service.options.WsMessage`):

- ``{"text": ..., "voice": ...}`` (or ``"input"``, OpenAI's name; not both): seed 004's exchange:
  the whole text, binary audio frames, then ``{"done": true, "metrics": {...}}``;
- with ``"context_id"``: several utterances on one socket, audio as
  ``{"type": "audio", "context_id", "sequence", "audio": base64}`` frames;
- ``"append"`` adds text (spoken once a clause or sentence is complete), ``"flush"`` speaks what
  has arrived, ``"end"`` ends the context after its audio, ``"cancel"`` stops it at once and
  answers with a "heard" report (``"played_s"``: what the client's player played);
- ``"timestamps"`` (pieces | words | chars): a ``{"type": "timestamps"}`` message after each text
  piece's audio (:mod:`lyre.service.timing`).

Settings (voice, response_format/format, sample_rate, sampling) are fixed by a context's first
message: a later message on the open context may repeat them (an alias of its voice included), and
one that would change them is refused. Without a context_id, ``text`` opens, speaks and ends the
context; the next ``text`` after its ``done`` opens a new one with its own settings (one sent
before is refused: the context is still sending its audio). ``metrics.ttfb_ms`` counts from the
message that completed the context's first piece (its text, or the append, flush or end that
completed it), not from when the context was opened.

Every bad message (not JSON, unknown fields, no action, wrong types, a refused setting) gets an
``{"error": {...}}`` frame (with its ``context_id``) and changes nothing else: a refused first
message opens nothing, and other contexts on the socket go on. Limits: ``server.ws_max_message_bytes``
(larger messages close the socket with 1009), ``server.max_contexts_per_socket``,
``server.ws_idle_timeout_s`` (a socket with nothing to speak and no message for that long is closed
with 1000). There is no heartbeat: a listener that reads slowly is ended by the slow-consumer rule,
not by a missed pong.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from lyre.api.access import AccessLog, Entry
from lyre.api.common import (
    InFlight,
    cancelled_by_drain,
    classify,
    describe_text,
    error_body,
    json_object,
)
from lyre.api.http.shared import ACCESS, ACCESS_LOG, ACCOUNT, INFLIGHT, SERVICE, draining
from lyre.api.http.tokens import GRANT, token_protocol
from lyre.api.http.ws_context import Context, feed, whole_text
from lyre.audio.formats import AudioEncoder, AudioFormatError, check_bitrate, check_format
from lyre.errors import InvalidRequest, LyreError, ServiceUnavailable
from lyre.service.options import SamplingOptions, WsMessage, parse
from lyre.service.tts import TTSService

log = logging.getLogger("lyre.ws")

WEBSOCKET = "/v1/audio/stream"
RECENT = 8  # ended contexts a cancel can still get a "heard" report of (the client may play long after)


async def websocket(request: web.Request) -> web.WebSocketResponse:
    draining(request)
    service = request.app[SERVICE]
    cfg = service.config.server
    # The handshake must name back one of the subprotocols a browser offered, else it drops the
    # socket: "lyre" when offered beside the token's ["lyre", "lyre-token.<token>"] (the token is then
    # not echoed), else the token's own.
    with_token = token_protocol(request)
    ws = web.WebSocketResponse(heartbeat=None, max_msg_size=cfg.ws_max_message_bytes, compress=False,
                               protocols=["lyre", *([with_token] if with_token else [])])
    await ws.prepare(request)
    socket = Socket(ws, service, request.app[INFLIGHT], request[ACCOUNT], request[ACCESS], request.app[ACCESS_LOG])
    grant = request.get(GRANT)
    over = None
    if grant is not None and grant.scope.max_session_s is not None:  # (a timer: a cancel could be swallowed)
        over = asyncio.get_running_loop().call_later(grant.scope.max_session_s, socket.session_over)
    with request.app[INFLIGHT].request():
        unsubscribe = request.app[INFLIGHT].on_drain(socket.on_drain)
        try:
            await socket.serve(cfg.ws_idle_timeout_s)
        except asyncio.CancelledError:
            await socket.close_all(cancelled_by_drain(request.app[INFLIGHT]))
            raise
        finally:
            if over is not None:
                over.cancel()
            unsubscribe()
            await socket.close_all(None)
    return ws


class Socket:
    """One WebSocket: its contexts and the lock that keeps their frames whole."""

    def __init__(self, ws: web.WebSocketResponse, service: TTSService, inflight: InFlight, account: str,
                 entry: Entry, access: AccessLog):
        self.ws, self.service, self.inflight, self.account = ws, service, inflight, account
        self.entry, self.access = entry, access  # the socket's access-log line (written at its close)
        entry.extra.update(messages=0, contexts=0)
        self.contexts: dict[str | None, Context] = {}
        self.recent: OrderedDict[str | None, Context] = OrderedDict()  # the last RECENT ended, for a late cancel's report
        self.send_lock = asyncio.Lock()
        self.stopping = False  # close_all is ending every context (and closes the socket itself)
        self._closing: asyncio.Future | None = None  # the close when a client token's session is over

    async def serve(self, idle_timeout_s: float) -> None:
        while not self.ws.closed:
            try:
                msg = await self.ws.receive(timeout=idle_timeout_s)
            except asyncio.TimeoutError:
                if any(ctx.utterance.speaking for ctx in self.contexts.values()):
                    continue  # the silence is the server's: it is still speaking
                # nothing to say and no message: open contexts waiting for text hold nothing forever
                await self.close_all(None)
                await self.ws.close(code=WSCloseCode.OK, message=b"idle: no message and nothing to speak")
                return
            if msg.type == WSMsgType.TEXT:
                await self.handle(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await self.send({"error": {"message": "send JSON text messages", "type": "invalid_request_error",
                                           "code": "invalid_message"}})
            elif msg.type == WSMsgType.ERROR:
                log.info("websocket closed: %s", self.ws.exception())
                return
            elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                return

    async def handle(self, raw: str) -> None:
        cid: Any = None
        self.entry.extra["messages"] += 1
        try:
            data = json_object(raw, "the message")
            cid = data.get("context_id") if isinstance(data.get("context_id"), str) else None
            message = parse(WsMessage, data)
            await self.apply(message)
        except (LyreError, AudioFormatError) as e:
            body = error_body(e)
            self.log_line("ws message", classify(e).http_status, body["code"])
            await self.send({"error": body, **({"context_id": cid} if cid is not None else {})})
        except ConnectionResetError:
            pass
        except Exception as e:  # noqa: BLE001 - a bug answers this message; the socket and its other contexts go on
            log.exception("websocket message failed")
            self.log_line("ws message", 500, "internal_error")
            await self.send({"error": {"message": f"internal error: {type(e).__name__}", "type": "server_error",
                                       "code": "internal_error"}})

    def log_line(self, route: str, status: int, code: str | None, **fields: Any) -> Entry:
        """An access-log line of this socket's (a refused message, a context that ended)."""
        entry = Entry("ws", route, self.entry.client, self.entry.request_id, account=self.account, status=status,
                      code=code, **fields)
        self.access.write(entry)
        return entry

    async def apply(self, m: WsMessage) -> None:
        cid = m.context_id
        ctx = self.contexts.get(cid)
        if m.played_s is not None and not m.cancel:
            raise InvalidRequest("'played_s' goes with 'cancel': how much of the audio the client played")
        if m.cancel:
            heard = {}
            ended = self.recent.get(cid) if ctx is None else None  # a barge-in after all its audio was sent
            if ctx is not None or ended is not None:
                heard = {"heard": (ctx or ended).heard(m.played_s)}
            if ctx is not None:
                await ctx.stop()
            await self.send({"done": True, "cancelled": True, **heard,
                             **({"context_id": cid} if cid is not None else {})})
            return
        text, field = whole_text(m)
        if text is None and m.append is None and not m.flush and not m.end:
            raise InvalidRequest("a message needs one of: text (or input), append, flush, end, cancel")
        if text is not None and not text.strip():
            raise InvalidRequest(f"{field} is empty: there is nothing to speak")
        if ctx is None:
            if text is None and m.append is None:
                raise InvalidRequest(f"unknown context {cid!r}: start it with 'text' or 'append'" if cid is not None
                                     else "nothing to flush or end: start with 'text' or 'append'")
            await self.open(m, text)
            return
        if ctx.utterance.ended:
            raise InvalidRequest("this context has ended and is still sending its audio: wait for its done "
                                 "message" + (", or use another context_id" if cid is not None else ""))
        ctx.check_settings(m)
        feed(ctx.utterance, m, text)

    async def open(self, m: WsMessage, text: str | None) -> None:
        """A new context with its first message's settings and text; a refused first message opens nothing."""
        if self.inflight.draining:
            raise ServiceUnavailable("the server is shutting down: no new contexts")
        limit = self.service.config.server.max_contexts_per_socket
        if len(self.contexts) >= limit:
            raise InvalidRequest(f"this socket has {len(self.contexts)} open contexts; "
                                 f"server.max_contexts_per_socket is {limit}")
        fmt = m.response_format or m.format or "pcm"
        rate = check_format(fmt, m.sample_rate)
        bitrate = check_bitrate(fmt, rate, m.bitrate)
        voice = await self.service.voices.resolve(m.voice, self.account)  # a built-in name, or a cloned voice
        release = self.service.quotas.take(self.account, "ws_contexts")  # over all the account's sockets
        try:
            utterance = self.service.utterance(voice, account=self.account, protocol="ws", **m.options())
        except BaseException:
            release()
            raise
        try:
            feed(utterance, m, text)
            encoder = AudioEncoder(fmt, m.sample_rate, bitrate=m.bitrate)
        except BaseException:
            utterance.cancel()
            release()
            raise
        defaults = self.service.family.sampling(self.service.config.sampling, {})  # (the family's: Qwen3-TTS's own)
        settings = {"voice": voice if isinstance(voice, str) else voice.id, "response_format": fmt,
                    "sample_rate": rate, "bitrate": bitrate, "timestamps": m.timestamps, "language": m.language,
                    "instructions": m.instructions,
                    **{name: getattr(defaults, name) for name in SamplingOptions.model_fields},
                    **m.sampling()}  # what the context uses: given or default
        first = text if text is not None else m.append
        log.debug("websocket context %r: %s, %s", m.context_id, describe_text(first), fmt)
        self.entry.extra["contexts"] += 1
        self.contexts[m.context_id] = Context(self, m.context_id, utterance, encoder, settings, release,
                                              self.entry.extra["contexts"])

    def ended(self, ctx: Context) -> None:
        ctx.release()  # its place in the account's accounts.max_ws_contexts
        if self.contexts.get(ctx.cid) is ctx:
            del self.contexts[ctx.cid]
        self.recent[ctx.cid] = ctx
        self.recent.move_to_end(ctx.cid)
        while len(self.recent) > RECENT:
            self.recent.popitem(last=False)
        if self.inflight.draining and not self.contexts and not self.stopping:
            self.on_drain()

    def on_drain(self) -> None:
        """Draining: an idle socket closes now; a busy one once its contexts have ended."""
        if not self.contexts and not self.ws.closed:
            asyncio.get_running_loop().create_task(
                self.ws.close(code=WSCloseCode.GOING_AWAY, message=b"the server is shutting down"))

    def session_over(self) -> None:
        """The client token's ``max_session_s`` is over: every context ends, and the socket closes (1008)."""

        async def close() -> None:
            await self.close_all(None)
            with contextlib.suppress(Exception):
                await self.ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"the client token's max_session_s "
                                    b"is over")

        self._closing = asyncio.ensure_future(close())  # (kept: a task nobody holds may be collected)

    async def close_all(self, error: LyreError | None) -> None:
        """Stop every context (the socket closed, or the drain timeout passed: then say why first)."""
        self.stopping = True
        for ctx in list(self.contexts.values()):
            await ctx.stop(error)
        if error is not None and not self.ws.closed:
            with contextlib.suppress(Exception):
                await self.ws.close(code=WSCloseCode.GOING_AWAY, message=b"the server is shutting down")

    async def send(self, message: dict | bytes) -> None:
        async with self.send_lock:  # contexts share the socket: one frame at a time
            if self.ws.closed:
                return
            if isinstance(message, bytes):
                await self.ws.send_bytes(message)
            else:
                await self.ws.send_json(message)
