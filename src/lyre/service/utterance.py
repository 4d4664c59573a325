"""``Utterance``: one utterance whose text arrives in pieces (an LLM writing), spoken as one ordered
stream of audio. The WebSocket contexts, gRPC ``StreamingSynthesize`` and the library
(``tts.utterance(...)``) all use it; the front ends only translate messages.

    async with tts.utterance(voice="tara") as u:
        u.append("Hello there, ")          # the first complete clause starts synthesis
        u.append("how are you? I'm fine.")
        u.end()                            # speak the rest; the stream ends after it
        async for chunk in u:              # AudioChunk, offsets across the whole utterance
            play(chunk.pcm)

Text is cut into pieces by :class:`~lyre.service.text.SentenceStream` (sentences, each at most the
profile's ``max_text_chars``). Pieces are spoken in order, each as one session started by the
utterance's :class:`Speaker` (the service's ``stream`` with the utterance's voice, account, audit
row and watermark); at most one piece
generates ahead of the one being heard, so there is no gap between pieces and one utterance never
holds more than two admission places. Text waiting to be spoken is bounded by
``server.max_pending_text_chars``: an append beyond it is refused (InvalidRequest) and changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from lyre.core.stats import worst_stop
from lyre.errors import (
    ControlTokenInText,
    InvalidRequest,
    OverloadedError,
    ServiceUnavailable,
    SynthesisCancelled,
    SynthesisTimeout,
)
from lyre.model.orpheus import CONTROL_TAIL
from lyre.service.text import SentenceStream
from lyre.service.timing import Timeline
from lyre.text import ssml

if TYPE_CHECKING:
    from lyre.core.stats import SessionMetrics
    from lyre.model.orpheus import ControlToken
    from lyre.service.stream import AudioChunk, SpeechStream
    from lyre.trust.audit import AuditEntry

AHEAD = 1  # pieces generating ahead of the one being heard


class SsmlPiece(str):
    """A piece that is an SSML document (spoken as one synthesis), and where it starts in the utterance's text."""

    offset: int

    def __new__(cls, text: str, offset: int) -> SsmlPiece:
        piece = super().__new__(cls, text)
        piece.offset = offset
        return piece


class Speaker(Protocol):
    """Starts the synthesis of one piece of the utterance (raises as ``TTSService.stream`` does)."""

    def __call__(self, text: str) -> SpeechStream: ...


@dataclass(frozen=True)
class UtteranceMetrics:
    """How an utterance went, over its pieces."""

    ttfb_ms: float | None  # from when its first piece was complete to its first audio
    tokens: int
    prompt_tokens: int
    audio_seconds: float
    chunks: int
    late_chunks: int
    pieces: int  # spoken to the end
    stop_reason: str | None = None  # the worst of its pieces' (lyre.core.stats.STOP_REASONS)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Utterance:
    def __init__(self, speak: Speaker, max_chars: int, max_pending_chars: int, audit: AuditEntry | None = None,
                 charge: Callable[[int], None] | None = None,
                 control: Callable[[str], ControlToken | None] | None = None, ssml_mode: str | None = None,
                 check_document: Callable[[str], int] | None = None):
        self._speak = speak
        self._ssml = ssml_mode  # the request's ``ssml``: an append that starts with <speak> is a whole document
        self._check_document = check_document  # checks one as its synthesis would; the characters it is charged
        self._charge = charge  # counts appended characters against the account's quota (raises to refuse)
        self._control = control  # finds text the tokenizer reads as a control token (orpheus.control_token)
        self._tail = ""  # the last CONTROL_TAIL characters appended: a control token may span two appends
        self._audit = audit  # the utterance's one audit row: every piece's PCM, recorded when it ends
        self.max_pending_chars = max_pending_chars
        self._text = SentenceStream(max_chars)
        self._queue: deque[str] = deque()  # complete pieces not started yet
        self._queued_chars = 0
        self._streams: deque[tuple[SpeechStream, float]] = deque()  # started (and when), in order: [0] is heard
        self._ready_at: float | None = None  # when the first piece was complete: TTFB counts from here
        self._changed = asyncio.Event()
        self._held = ""  # a high surrogate whose pair comes with the next append
        self.ended = False  # no more text will come
        self.closed = False  # finished, failed or cancelled
        self.pieces: list[str] = []  # every piece handed to synthesis, in order
        self.timeline = Timeline()  # where the pieces' segments are in the caller's text and in the audio
        self._samples = 0
        self._index = 0
        self.metrics = UtteranceMetrics(None, 0, 0, 0.0, 0, 0, 0)  # grows as each piece ends

    # --- the producer side ----------------------------------------------------------------------

    @property
    def pending_chars(self) -> int:
        """Text received but not yet handed to synthesis."""
        return self._text.pending_chars + self._queued_chars + len(self._held)

    @property
    def speaking(self) -> bool:
        """Whether it has something to say: pieces started or waiting, or audio still to come after its end."""
        return not self.closed and bool(self._streams or self._queue or self.ended)

    def append(self, text: str) -> None:
        """Add text; complete pieces start synthesising at once. Raises InvalidRequest (nothing
        changes) for text that is not a string, not valid Unicode, spells a control token of the
        model (alone or with the end of the text before it), or would exceed the bound."""
        self._check_open()
        if not isinstance(text, str):
            raise InvalidRequest(f"appended text must be a string, got {type(text).__name__}")
        held = self._held
        text = self._join_surrogates(text)
        chars = len(text)
        try:
            self._check_control(text)
            document = self._ssml != "off" and ssml.is_ssml(text)
            if document:  # (checked whole now: nothing changes when it is refused)
                chars = self._document(text)
        except InvalidRequest:
            self._held = held
            raise
        if self.pending_chars + len(text) > self.max_pending_chars:
            self._held = held
            raise InvalidRequest(
                f"this append would leave {self.pending_chars + len(text)} characters waiting to be spoken; "
                f"server.max_pending_text_chars is {self.max_pending_chars}: send more once audio has played")
        if self._charge is not None:
            try:
                self._charge(chars)
            except BaseException:
                self._held = held
                raise
        if self._audit is not None:
            self._audit.add_text(text)
        offset = self.timeline.received
        self.timeline.add_text(text)
        self._tail = (self._tail + text)[-CONTROL_TAIL:]
        if document:  # the text before it is spoken first, then the document as one piece (queued together)
            self._add([*self._text.flush(), SsmlPiece(text, offset)])
        else:
            self._add(self._text.append(text))

    def _document(self, text: str) -> int:
        """The characters an appended SSML document is charged; InvalidRequest as its synthesis would refuse it."""
        if self._check_document is None:
            raise InvalidRequest("this utterance takes no SSML documents")
        return self._check_document(text)

    def _check_control(self, text: str) -> None:
        if self._control is None or not text:
            return
        found = self._control(self._tail + text)
        if found is None:
            return
        if found.start >= len(self._tail):  # where in this append
            at = dataclasses.replace(found, start=found.start - len(self._tail), end=found.end - len(self._tail))
            raise ControlTokenInText(at.refusal("the appended text"))
        raise ControlTokenInText(dataclasses.replace(found, start=-1, end=-1).refusal(
            "the appended text, with the end of the text before it,"))

    def flush(self) -> None:
        """Speak everything received so far, complete sentence or not."""
        self._check_open()
        self._add(self._text.flush())

    def end(self) -> None:
        """No more text: speak the rest; the audio stream ends after it."""
        if self.ended or self.closed:
            return
        self._held = ""  # half of a character never completed
        self._add(self._text.flush())
        self.ended = True
        self._changed.set()

    def cancel(self) -> None:
        """Stop at once: every started piece is cancelled (its KV slot freed), nothing more is spoken."""
        self._record("cancelled", "cancelled")
        self.ended = self.closed = True
        for stream, _ in self._streams:
            stream.cancel()
        self._streams.clear()
        self._queue.clear()
        self._queued_chars = 0
        self._changed.set()

    async def aclose(self) -> None:
        self.cancel()

    async def __aenter__(self) -> Utterance:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.cancel()

    def _check_open(self) -> None:
        if self.ended or self.closed:
            raise InvalidRequest("the utterance has ended: no more text can be added")

    def _join_surrogates(self, text: str) -> str:
        """Join a character split between appends (UTF-16 surrogate halves, as a JavaScript client may
        send them); any other lone surrogate is refused."""
        text = self._held + text
        held = text[-1] if text and "\ud800" <= text[-1] <= "\udbff" else ""
        body = text[: len(text) - len(held)]
        try:
            body = body.encode("utf-16", "surrogatepass").decode("utf-16")
            body.encode("utf-8")
        except UnicodeError:
            raise InvalidRequest("appended text is not valid Unicode (it contains a lone surrogate)") from None
        self._held = held
        return body

    def _add(self, pieces: list[str]) -> None:
        for piece in pieces:
            self._queue.append(piece)
            self._queued_chars += len(piece)
        if pieces:
            if self._ready_at is None:
                self._ready_at = time.monotonic()
            self._start(raise_overload=False)
            self._changed.set()

    def _start(self, raise_overload: bool) -> None:
        """Start queued pieces while fewer than 1 + AHEAD are started. Overload of a piece ahead
        leaves it queued (tried again when the piece before it ends); ``raise_overload``: nothing
        is playing, so overload is the caller's answer."""
        while self._queue and len(self._streams) <= AHEAD:
            piece = self._queue[0]
            started_at = time.monotonic()  # not after the session's own start (its TTFB's origin)
            try:
                stream = self._speak(piece)
            except OverloadedError:
                if raise_overload and not self._streams:
                    raise
                return
            except InvalidRequest:  # this piece can never run (e.g. max_tokens beyond its slot): the
                self._queue.popleft()  # error is the answer, and the pieces after it are still spoken
                self._queued_chars -= len(piece)
                self.timeline.skip(piece)
                raise
            self._queue.popleft()
            self._queued_chars -= len(piece)
            self._streams.append((stream, started_at))
            at = piece.offset if isinstance(piece, SsmlPiece) else None
            for i, (text, places) in enumerate(zip(stream.segment_texts, stream.segment_places, strict=True)):
                self.timeline.expect((len(self.pieces), i), text,
                                     None if places is None or at is None else tuple(at + p for p in places))
            if at is not None:
                self.timeline.consume(at + len(piece))  # (its closing markup too: what follows is looked for after it)
            self.pieces.append(piece)

    # --- the consumer side ----------------------------------------------------------------------

    @property
    def current_piece(self) -> str | None:
        """The text of the piece the last chunk returned belongs to (None before the first)."""
        return self.pieces[self.metrics.pieces] if self.metrics.pieces < len(self.pieces) else None

    def __aiter__(self) -> Utterance:
        return self

    async def __anext__(self) -> AudioChunk:
        """The next chunk, in order across pieces; StopAsyncIteration after the last piece of an ended
        utterance. A piece that fails or is refused raises its error and ends the utterance."""
        try:
            while True:
                if self.closed:
                    raise StopAsyncIteration
                if not self._streams:
                    self._start(raise_overload=True)
                if not self._streams:
                    if self.ended and not self._queue:
                        self._record("finished", self.metrics.stop_reason)
                        self.closed = True
                        raise StopAsyncIteration
                    self._changed.clear()
                    await self._changed.wait()
                    continue
                stream, started_at = self._streams[0]
                heard = self.metrics.pieces  # (the piece being heard)
                try:
                    chunk = await stream.__anext__()
                except StopAsyncIteration:
                    self._streams.popleft()
                    self._count(stream.metrics, started_at)
                    self.timeline.through((heard, len(stream.segment_texts) - 1))
                    continue
                self.timeline.place((heard, chunk.segment), len(chunk.pcm), chunk.segment_end, chunk.silence_before,
                                    chunk.silence_after)
                chunk = dataclasses.replace(chunk, offset_samples=self._samples, index=self._index)
                self._samples += len(chunk.pcm)
                self._index += 1
                return chunk
        except StopAsyncIteration:
            raise
        except BaseException as e:  # a failed piece, or the consumer went away: nothing keeps a slot
            if isinstance(e, SynthesisCancelled):
                self._record("cancelled", e.reason)  # (slow_consumer, ...: the piece's own reason)
            elif isinstance(e, SynthesisTimeout):
                self._record("cancelled", "timeout")
            elif isinstance(e, ServiceUnavailable):
                self._record("cancelled", "shutdown")
            elif not isinstance(e, asyncio.CancelledError):
                self._record("failed", getattr(e, "code", type(e).__name__))
            self.cancel()
            raise

    def _record(self, outcome: str, reason: str | None = None) -> None:
        if self._audit is not None and not self.closed:
            self._audit.finish(outcome, reason)

    def _count(self, m: SessionMetrics | None, started_at: float) -> None:
        """Add a finished piece's metrics. TTFB is the utterance's: from when its first piece was complete
        (the message that completed it, not the socket's idle time before) to its first audio, so a
        piece that had to wait for admission counts that wait."""
        total = self.metrics
        ttfb = total.ttfb_ms
        if ttfb is None and m is not None and m.ttfb_ms is not None:
            ready_at = started_at if self._ready_at is None else self._ready_at
            ttfb = m.ttfb_ms + 1000 * max(0.0, started_at - ready_at)
        if m is None:
            self.metrics = dataclasses.replace(total, ttfb_ms=ttfb, pieces=total.pieces + 1)
            return
        self.metrics = UtteranceMetrics(ttfb, total.tokens + m.tokens, total.prompt_tokens + m.prompt_tokens,
                                        total.audio_seconds + m.audio_seconds, total.chunks + m.chunks,
                                        total.late_chunks + m.late_chunks, total.pieces + 1,
                                        worst_stop(total.stop_reason, m.stop_reason))
