"""One batch item, synthesised in the scheduler's batch lane and written to a file as it is produced.

The item's text becomes segments as for any synthesis (a text longer than the profile's
``max_text_chars`` is packed by sentences, as an utterance's is). Each segment is its own batch
session (:mod:`lyre.core.lanes`): when the lane evicts it for a live caller, that segment — and only
it — is generated again, and the audio of the evicted attempt is dropped. A segment's audio is
watermarked, hashed into the item's audit row and encoded only once the segment is complete, so
the file holds each segment once. The file is the caller's temporary one: it becomes visible
(published) only by the runner, after it is complete.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from lyre.audio.formats import AudioEncoder
from lyre.core.lanes import EVICTED
from lyre.core.session import CANCELLED, FAILED, Segment, Session
from lyre.engine.base import SamplingParams
from lyre.errors import ServiceUnavailable, SynthesisCancelled, TextTooLong
from lyre.model import orpheus
from lyre.service import said
from lyre.service.shaping import to_int16
from lyre.service.stream import SpeechStream
from lyre.service.text import pack_sentences


@dataclass(frozen=True)
class Rendered:
    sha256: str  # of the file
    size: int  # bytes
    duration_s: float  # of the audio as heard (after its speed)
    evictions: int  # segments generated again because the lane gave their slot to a live caller
    audit: Any = None  # the attempt's audit entry, still open: completed once the item is (the runner's)


def segments_of(tts: Any, text: str, voice: Any, options: dict[str, Any], account: str
                ) -> tuple[list[Segment], SamplingParams]:
    """The item's segments and sampling (raises what the service's validation raises). Blocking:
    normalisation and tokenisation (and lexicons read from the database)."""
    cfg = tts.config
    limit = cfg.active_profile.max_text_chars
    most = max(limit, cfg.server.max_input_chars)
    if len(text) > most:
        raise TextTooLong(f"text has {len(text)} characters; at most {most} are accepted (server.max_input_chars)")
    whole = len(text) <= limit or said.is_document(text, options.get("ssml"))
    segments: list[Segment] = []
    params = None
    for piece in [text] if whole else pack_sentences(text, limit):
        made, params, _ = tts._prepare(piece, voice, options, account)
        segments += made
    return segments, params


async def render(tts: Any, claim: Any, path: Path) -> Rendered:
    """Synthesise ``claim``'s item into ``path`` (created or truncated). Raises what ends it: a
    LyreError for the item (it fails), ServiceUnavailable (this server is stopping: the item is
    given back), CancelledError (its batch was cancelled or its lease lost). On success its audit
    row is left open: the runner completes it once the item is (an attempt whose result is never
    shown is no completed synthesis)."""
    req, account = claim.request, claim.owner
    voice = await tts.voices.resolve(req["voice"], account)
    segments, params = await asyncio.to_thread(segments_of, tts, req["text"], voice, req["options"], account)
    audit = tts._audit_entry(voice, account, "batch")
    audit.trace = f"{claim.batch_id}/{claim.custom_id}"[:320]
    audit.add_text(req["text"])
    audit.begin()
    mark = tts.marker()
    speed = req.get("speed") or 1.0
    encoder = AudioEncoder(req["response_format"], req.get("sample_rate"), speed=speed,
                           stream=req["response_format"] != "flac", bitrate=req.get("bitrate"),
                           mark=tts.marker() if speed != 1.0 else None)  # (marked again after a tempo change)
    samples = evictions = 0
    outcome, reason = FAILED, "error"
    done = False
    try:
        await audit.recorded()  # no audio is kept before its audit row is written
        with open(path, "wb") as out:
            for seg in segments:
                while True:
                    try:
                        pcm = await _segment(tts, seg, params, account)
                        break
                    except SynthesisCancelled as e:
                        if e.reason != EVICTED:
                            raise
                        evictions += 1  # a live caller took its slot: this segment again, from its start
                if mark is not None and pcm.size:
                    pcm = to_int16(mark(pcm.astype(np.float32) / 32767.0))
                audit.add_pcm(pcm)
                samples += pcm.size
                await asyncio.to_thread(_write, out, encoder.encode, pcm)
            await asyncio.to_thread(_write, out, lambda _: encoder.finish(), None)  # (the encoder's tail)
        if req["response_format"] == "wav":
            _wav_sizes(path)
        digest, size = await asyncio.to_thread(_digest, path)
        done = True
    except (asyncio.CancelledError, SynthesisCancelled, ServiceUnavailable):
        outcome, reason = CANCELLED, "cancelled"
        raise
    finally:
        encoder.close()
        if not done:
            audit.finish(outcome, reason)
    return Rendered(digest, size, samples / orpheus.SAMPLE_RATE / speed, evictions, audit)


async def _segment(tts: Any, seg: Segment, params: SamplingParams, account: str) -> np.ndarray:
    """One segment as a batch session of its own: its int16 audio, whole (silence and stretch included)."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    fresh = replace(seg, parser=None, decoder=None, submitted=False, done_generating=False, stop=None)
    session = Session(session_id=f"b{next(tts._ids)}", segments=[fresh], sampling=params,
                      sink=lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev), created=time.monotonic(),
                      account=account, batch=True)
    if not tts._loop.post(lambda: tts.scheduler.submit(session)):
        raise ServiceUnavailable("the service is shutting down")
    stream = SpeechStream(session, events, lambda: tts._cancel(session.session_id), None, False, None)
    parts = [chunk.pcm async for chunk in stream]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)


def _write(out: Any, encode: Any, pcm: Any) -> None:
    data = encode(pcm)
    if data:
        out.write(data)


def _wav_sizes(path: Path) -> None:
    """A streamed WAV header says "length unknown": now that the file is whole, write its sizes."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<I", min(size - 8, 0xFFFFFFFF)))
        f.seek(40)
        f.write(struct.pack("<I", min(size - 44, 0xFFFFFFFF)))


def _digest(path: Path) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(1 << 16):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size
