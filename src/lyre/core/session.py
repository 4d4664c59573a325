"""Sessions: one synthesis request's segments, tokens, status, delivered audio and its listener's clock.

A session moves pending -> active -> finished | cancelled | failed. The scheduler alone changes
its status; the audio pipeline alone changes what was delivered; the consumer side (another
thread) only bumps ``consumed_samples``. Events go to the consumer through ``sink``.

The listener's clock. From the first chunk on, a session models its listener as a real-time
player: ``played_s`` advances with time but, like a player that waits when its buffer runs dry,
not past the audio delivered — unless the session is *throttled* (it stopped generating because
its client left too much audio unread): then the wait is the client's, and its clock runs on, by at
most :data:`MAX_RUN_ON_S` between two ticks (the engine thread ticks every step: a longer gap is the
server's lateness, which a listener never pays for). A listener whose audio is time-stretched (a
response's ``speed``) plays ``tempo`` seconds of it a second. While the event loop that writes audio to the
clients is late (a starved process), the clock pauses altogether. Slack
(audio delivered minus audio played) orders decoding and chunk sizes; how far the client's reads
are behind ``played_s`` decides whether it is a slow consumer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lyre.core.stats import SessionMetrics
from lyre.engine.base import SamplingParams
from lyre.family.base import SAMPLE_RATE, FrameParser

log = logging.getLogger("lyre.scheduler")

PENDING, ACTIVE, FINISHED, CANCELLED, FAILED = "pending", "active", "finished", "cancelled", "failed"
# a throttled listener's clock runs past its delivered audio by at most this between two ticks
# (steps come every few tens of ms; a step held for seconds, or a starved process, is the server's doing)
MAX_RUN_ON_S = 0.25
ENDED = (FINISHED, CANCELLED, FAILED)


@dataclass
class ChunkEvent:
    pcm: np.ndarray  # float32 samples at 24 kHz
    offset: int  # absolute sample offset of pcm[0] in the session's audio
    index: int  # 0, 1, 2, ...
    late: bool  # arrived after the listener had played all the audio before it
    segment: int = 0  # which of the session's segments it is audio of
    segment_end: bool = False  # the last of its segment (a segment whose last decode gave no audio has none)


@dataclass
class DoneEvent:
    outcome: str  # finished | cancelled | failed
    reason: str | None  # why it was cancelled or failed: cancelled, timeout, slow_consumer, engine error ...
    metrics: SessionMetrics


@dataclass
class Segment:
    prompt: Any  # the model family's prompt: token ids (Orpheus), rows (Qwen3-TTS); len() = its positions
    text: str = ""  # what it says, as the caller wrote it (for timestamps)
    places: tuple[int, ...] | None = None  # each character of text's offset in the caller's text (SSML)
    pause_before_s: float = 0.0  # silence before its audio and after it (SSML <break>), added by the stream
    pause_after_s: float = 0.0
    rate: float = 1.0  # its audio is played this many times faster, pitch kept (SSML <prosody rate>), by the stream
    prefix_key: str | None = None  # a cloned voice's reference turn: the first prefix_len ids, kept by the engine
    prefix_len: int = 0
    parser: FrameParser | None = None  # the family's, from its engine's ids to frames (made when submitted)
    decoder: Any = None  # the codec's stream for this segment (lyre.codec.stream / window), once submitted
    codec_warmup: Any = None  # decoded before its first frame, unheard (a Qwen3-TTS clone's reference clip)
    submitted: bool = False
    done_generating: bool = False
    stop: str | None = None  # how its generation ended (lyre.core.stats.STOP_REASONS)


@dataclass(eq=False)
class Session:
    """One synthesis request."""

    session_id: str
    segments: list[Segment]
    sampling: SamplingParams
    sink: Callable[[ChunkEvent | DoneEvent], None]
    created: float
    account: str = "default"  # whose: its quota and fair share of KV slots
    # a batch job's item (lyre.core.lanes): no listener (no clock, never a slow consumer, no session
    # timeout), slots only where live work leaves them, evicted within a step when live work needs one
    batch: bool = False
    order: int = 0
    status: str = PENDING
    cancel_reason: str | None = None
    # generation (scheduler)
    tokens: int = 0  # generated tokens over all segments
    last_run_step: int = -1
    first_token_at: float | None = None
    last_token_at: float | None = None
    throttled: bool = False  # not generating: its client holds scheduler.max_buffer_s of unread audio
    # a piece of an utterance: generated ahead while the piece before it is heard, so its listener
    # starts at its first read, not at its first chunk (until then it is no one's to be late for)
    listen_on_read: bool = False
    tempo: float = 1.0  # the listener plays its audio this many times faster (a response's ``speed``)
    # delivery (audio pipeline)
    current: int = 0  # segment whose audio is being emitted
    first_audio_at: float | None = None
    audio_samples: int = 0  # delivered
    chunks: int = 0  # delivered
    late_chunks: int = 0
    # the consumer side writes only this: samples of audio it has taken
    consumed_samples: int = 0
    # the listener's clock (scheduler)
    played_s: float = 0.0
    clock_at: float | None = None
    last_read_at: float | None = None
    unread_since: float | None = None  # when audio last became waiting for a client that had read everything
    _seen_consumed: int = 0

    @property
    def audio_seconds(self) -> float:
        return self.audio_samples / SAMPLE_RATE

    @property
    def unread_seconds(self) -> float:
        return (self.audio_samples - self.consumed_samples) / SAMPLE_RATE

    def deliver(self, ev: ChunkEvent | DoneEvent) -> bool:
        """Hand ``ev`` to the consumer. A sink that raises (e.g. its event loop has closed) is this
        session's fault alone: it is marked to be cancelled (``delivery_failed``) and the scheduler
        ends it at its next step; the engine thread goes on."""
        try:
            self.sink(ev)
            return True
        except Exception as e:  # noqa: BLE001 - the consumer's failure, not the engine's
            if self.cancel_reason is None:
                log.warning("session %s: its consumer cannot take events (%s: %s); cancelling it",
                            self.session_id, type(e).__name__, e)
                self.cancel_reason = "delivery_failed"
            return False

    def request_id(self, k: int) -> str:
        return f"{self.session_id}#{k}"

    def start_clock(self, now: float) -> None:
        """The first chunk is out: the listener starts playing (a piece generated ahead: once read)."""
        self.first_audio_at = now
        if not (self.listen_on_read or self.batch):
            self.clock_at = self.last_read_at = now

    def tick(self, now: float, server_late: bool = False) -> None:
        """Advance the listener's clock to ``now`` and note whether the client read anything since.
        ``server_late``: the process could not hand audio to the client in time (its event loop is
        late): the clock pauses, and so does the time since the client's last read."""
        if self.clock_at is None:
            if self.first_audio_at is not None and self.consumed_samples > 0 and not self.batch:  # its turn came: it is heard now
                self.clock_at = self.last_read_at = now
                self._seen_consumed = self.consumed_samples
            return
        dt, self.clock_at = max(0.0, now - self.clock_at), now
        if server_late:
            self.last_read_at += dt
            if self.unread_since is not None:
                self.unread_since += dt
        elif self.throttled:  # the client is the reason it waits: its clock runs on past the audio, but by at
            # most MAX_RUN_ON_S a tick: a longer gap between ticks is the server's own lateness (a long
            # step, a starved process), and through it the listener only plays what it has
            self.played_s = max(self.played_s + min(dt, MAX_RUN_ON_S) * self.tempo,
                                min(self.played_s + dt * self.tempo, self.audio_seconds))
        else:  # a player waits for audio that is late (without forgetting what it waited for before)
            self.played_s = max(self.played_s, min(self.played_s + dt * self.tempo, self.audio_seconds))
        if self.consumed_samples != self._seen_consumed:
            self._seen_consumed = self.consumed_samples
            self.last_read_at = now

    def playing_at(self, now: float) -> float:
        """Seconds played by ``now`` if the listener had not run dry since the last tick."""
        return self.played_s + (max(0.0, now - self.clock_at) * self.tempo if self.clock_at is not None else 0.0)

    def slack(self, now: float | None = None) -> float:
        """Seconds of listening the listener holds beyond what it has played (its audio seconds / tempo);
        -inf before the first audio."""
        if self.first_audio_at is None:
            return float("-inf")
        return (self.audio_seconds - self.played_s) / self.tempo

    def behind_s(self) -> float:
        """Seconds the client's reads are behind its listener's clock (negative: it has read ahead)."""
        return self.played_s - self.consumed_samples / SAMPLE_RATE

    def last_progress(self) -> float:
        """When it last made progress: created, a token generated, or audio read by its client."""
        return max(t for t in (self.created, self.last_token_at, self.last_read_at) if t is not None)

    def slow_consumer(self, now: float, limit: float) -> bool:
        """Its client is more than ``limit`` seconds behind its listener's clock, or, while behind it,
        has read nothing for that long since audio was there to read (a client that read ahead may
        pause; one whose server was slow to produce its next chunk is not slow itself)."""
        if self.clock_at is None or self.unread_seconds <= 0:  # (not being listened to yet: a piece ahead)
            return False
        behind = self.behind_s()
        idle = now - max(self.last_read_at, self.unread_since or self.last_read_at)
        return behind > limit or (behind > 0 and idle > limit)
