"""One utterance on a WebSocket (:mod:`lyre.api.http.ws`): a context, the task that sends its audio in
order, the settings its first message fixed, and how a message's text and actions feed it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol

from lyre.api.access import Entry
from lyre.api.common import classify, encode, error_body, finish
from lyre.audio.formats import AudioEncoder
from lyre.errors import InvalidRequest, LyreError
from lyre.model.orpheus import SAMPLE_RATE
from lyre.service.options import VOICE_OPTIONS, SamplingOptions, WsMessage
from lyre.service.utterance import Utterance


class Socket(Protocol):
    """What a context uses of its socket (:class:`lyre.api.http.ws.Socket`)."""

    service: Any  # the TTSService
    entry: Entry  # the socket's access-log line

    def ended(self, ctx: Context) -> None: ...

    def log_line(self, route: str, status: int, code: str | None, **fields: Any) -> Entry: ...

    async def send(self, message: dict | bytes) -> None: ...

# what a context's first message fixes (a later one may repeat them, never change them)
SETTINGS = ("voice", "response_format", "format", "sample_rate", "bitrate", "timestamps", *VOICE_OPTIONS,
            *SamplingOptions.model_fields)


def feed(utterance: Utterance, m: WsMessage, text: str | None) -> None:
    """A message's text and actions, in order; ``text`` (a whole text) ends the utterance after it (seed 004)."""
    for piece in (text, m.append):
        if piece is not None:
            utterance.append(piece)
    if m.flush:
        utterance.flush()
    if text is not None or m.end:
        utterance.end()


def whole_text(m: WsMessage) -> tuple[str | None, str]:
    """A message's whole text and the name it came under: ``text``, or ``input`` (OpenAI's name)."""
    if m.text is not None and m.input is not None:
        raise InvalidRequest("give the text as 'text' or as 'input' (its OpenAI name), not both")
    return (m.input, "input") if m.input is not None else (m.text, "text")


class Context:
    """One utterance on a socket and the task sending its audio, in order."""

    def __init__(self, socket: Socket, cid: str | None, utterance: Utterance, encoder: AudioEncoder,
                 settings: dict[str, Any], release: Callable[[], None], number: int):
        self.socket, self.cid, self.utterance, self.encoder = socket, cid, utterance, encoder
        self.release = release
        self.number = number  # the socket's n-th context (its access-log line names it so, not by its id)
        self.status, self.code, self.bytes = 499, "cancelled", 0  # how it ended: cancelled, until it is done
        self.settings = settings  # voice, response_format, sample_rate and sampling: fixed by the first message
        self.sequence = 0
        self.sent_samples = 0  # of the utterance's audio (24 kHz), sent to the socket
        self.started = time.monotonic()
        self.task = asyncio.get_running_loop().create_task(self._pump())
        # whatever ends it (a cancel even before its first step, when _pump's finally never runs),
        # nothing it started keeps a slot, an encoder or its account's context place
        self.task.add_done_callback(lambda _: self._ended())

    def _ended(self) -> None:
        self.utterance.cancel()
        self.encoder.close()
        self.socket.ended(self)
        seconds = self.utterance.metrics.audio_seconds
        self.socket.entry.bytes += self.bytes
        self.socket.log_line("ws context", self.status, self.code, bytes=self.bytes, audio_s=seconds,
                             started=self.started, extra={"context": self.number})

    def check_settings(self, m: WsMessage) -> None:
        """A later message may repeat this context's settings; one that would change them is refused."""
        for name in SETTINGS:
            value = getattr(m, name)
            if value is None:
                continue
            key = "response_format" if name == "format" else name
            if key == "voice":
                value = self.socket.service.config.model.resolve_voice(value) or value
            if value != self.settings[key]:
                now = self.settings[key]
                which, hint = (f"context {self.cid!r}", "open another context_id") if self.cid is not None else (
                    "the utterance without a context_id", "send 'end' and wait for its done message, or use a context_id")
                raise InvalidRequest(f"{which} is already open with {name} {'unset' if now is None else repr(now)}: "
                                     f"settings are fixed by its first message; {hint}")

    async def stop(self, error: LyreError | None = None) -> None:
        """Cancel at once (nothing more is sent but ``error``, when given)."""
        self.utterance.cancel()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        if error is not None:
            with contextlib.suppress(ConnectionResetError):
                await self._json({"error": error_body(error)})

    def heard(self, played_s: float | None) -> dict:
        """The "heard" report of a cancel: the audio sent, what the client says it played, and the text
        inside the lesser of the two (:meth:`lyre.service.timing.Timeline.heard`)."""
        sent_s = self.sent_samples / SAMPLE_RATE
        heard = self.utterance.timeline.heard(sent_s if played_s is None else min(sent_s, played_s))
        return heard.as_dict(sent_s=round(sent_s, 6), played_s=played_s)

    async def _pump(self) -> None:
        try:
            async for chunk in self.utterance:
                await self._audio(await encode(self.encoder, chunk.pcm))
                self.sent_samples += len(chunk.pcm)
                await self._timestamps()
            await self._audio(await finish(self.encoder))
            await self._timestamps()  # (the last piece ends with the utterance)
            self.status, self.code = 200, None
            await self._json({"done": True, "metrics": self.utterance.metrics.as_dict()})
        except LyreError as e:
            body = error_body(e)
            self.status, self.code = classify(e).http_status, body["code"]
            await self._json({"error": body})
        except ConnectionResetError:  # the socket went away
            pass

    async def _audio(self, data: bytes) -> None:
        if not data:
            return
        self.bytes += len(data)
        if self.cid is None:
            await self.socket.send(data)
        else:
            await self.socket.send({"type": "audio", "context_id": self.cid, "sequence": self.sequence,
                                    "audio": base64.b64encode(data).decode()})
        self.sequence += 1

    async def _timestamps(self) -> None:
        """A message for each text piece whose audio has all been sent (when the context asked for them)."""
        pieces = self.utterance.timeline.take()
        detail = self.settings["timestamps"]
        if detail is None:
            return
        for piece in pieces:
            await self._json({"type": "timestamps", **piece.as_dict(detail, sample_rate=self.encoder.sample_rate)})

    async def _json(self, message: dict) -> None:
        if self.cid is not None:
            message["context_id"] = self.cid
        await self.socket.send(message)

