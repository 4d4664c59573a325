"""What SSML asks of a stream's audio beyond the words: silence before and after a segment
(``<break>``, a paragraph's end) and a segment played faster or slower with its pitch kept
(``<prosody rate>``, FFmpeg's ``atempo`` through :class:`lyre.audio.formats.Stretch`).

It runs on the stream's consumer side (the event loop), on the engine's audio as it arrives, before
the watermark is applied (a mark applied before a time-stretch would be moved out of place). The
listener's clock on the engine thread counts the engine's audio: a segment sped up is heard sooner
than it expects, silence later."""

from __future__ import annotations

import numpy as np

from lyre.audio.formats import Stretch
from lyre.core.session import ChunkEvent, Segment
from lyre.family.base import SAMPLE_RATE


def to_int16(pcm: np.ndarray) -> np.ndarray:
    return (np.clip(pcm, -1.0, 1.0) * 32767.0).round().astype(np.int16)


def _float(pcm: np.ndarray) -> np.ndarray:
    return pcm.astype(np.float32) / 32767.0


class Shaping:
    """A stream's segments' silence and rates (one owner: the stream's consumer)."""

    def __init__(self, segments: list[Segment]):
        self.segments = segments
        self.needed = any(s.pause_before_s or s.pause_after_s or s.rate != 1.0 for s in segments)
        self._started: set[int] = set()
        self._ended: set[int] = set()
        self._stretch: tuple[int, Stretch] | None = None  # the segment being stretched, and its filter

    def chunk(self, ev: ChunkEvent) -> tuple[np.ndarray, int, int]:
        """``ev``'s audio as the listener hears it, and the samples of silence before and after its
        speech in it (the speech before that silence, when there is any, is the end of a stretched
        segment before it whose last chunk did not say so)."""
        if not self.needed:
            return ev.pcm, 0, 0
        seg = self.segments[ev.segment]
        head = self._flush(ev.segment)  # (what the segment before still held, when its end never came)
        pcm = ev.pcm
        if seg.rate != 1.0:
            if self._stretch is None:
                self._stretch = (ev.segment, Stretch(seg.rate))
            pcm = _float(self._stretch[1].process(to_int16(pcm), last=ev.segment_end))
            if ev.segment_end:
                self._stretch = None
        before = after = 0
        if ev.segment not in self._started:
            self._started.add(ev.segment)
            before = round(seg.pause_before_s * SAMPLE_RATE)
        if ev.segment_end:
            self._ended.add(ev.segment)
            after = round(seg.pause_after_s * SAMPLE_RATE)
        parts = [head, np.zeros(before, np.float32), pcm, np.zeros(after, np.float32)]
        return np.concatenate(parts).astype(np.float32, copy=False), before, after

    def finish(self) -> tuple[np.ndarray, int]:
        """At the stream's end: what a stretch still holds, then the silence after the last segment if
        its last chunk did not say it was the last; and the samples of that silence."""
        if not self.needed:
            return np.zeros(0, np.float32), 0
        tail = self._flush(None)
        last = len(self.segments) - 1
        after = 0 if last in self._ended else round(self.segments[last].pause_after_s * SAMPLE_RATE)
        self._ended.add(last)
        return np.concatenate([tail, np.zeros(after, np.float32)]), after

    def _flush(self, segment: int | None) -> np.ndarray:
        if self._stretch is None or self._stretch[0] == segment:
            return np.zeros(0, np.float32)
        _, stretch = self._stretch
        self._stretch = None
        return _float(stretch.process(np.zeros(0, np.int16), last=True))
