"""When each piece of the caller's text is heard: timestamps for voice agents, and the "heard" report
after a barge-in.

A stream speaks its text as pieces (the segments :func:`~lyre.service.text.split_text` makes, and for
an utterance the sentences :class:`~lyre.service.text.SentenceStream` hands out, each cut the same
way). A :class:`Timeline` learns each piece's text, in order, when its synthesis starts, finds it in
the caller's text (``start_char``/``end_char``: offsets into everything the caller sent, whitespace
and all), and places it in the stream's audio as its chunks arrive: a piece starts at the first
sample of its segment's first chunk and ends after the last of its last one, so its span is exact
to the sample. A finished piece is handed out once by :meth:`Timeline.take`.

Words within a piece are estimates (``estimated: true`` wherever they are sent): the piece's time is
shared among its words by their syllables, with a pause after punctuation. An emotion tag such as
``<laugh>`` takes time but is not a word. The characters' times (ElevenLabs' ``alignment``) share
each word's time among its letters.

:meth:`Timeline.heard` answers a barge-in: given the seconds of audio the listener heard, the pieces
wholly inside them, the estimated words of the piece it stopped in, and ``end_char``: how much of
the caller's text was heard (the caller's history keeps ``text[:end_char]``).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple

from lyre.model.orpheus import SAMPLE_RATE

LOOKAHEAD = 64  # how far past the last located character a piece's next character is looked for
SECONDS_PER_CHAR = 0.065  # an unfinished piece's length, before any piece has finished (~15 characters/s)
KEPT = 256  # finished pieces a timeline keeps (a heard report lists those wholly heard among them)

_UNIT = re.compile(r"<[a-z]+>|\S+")  # a word, or an emotion tag
_VOWELS = re.compile(r"[aeiouyà-ÿ]+", re.IGNORECASE)
_PAUSE = {".": 0.7, "!": 0.7, "?": 0.7, "…": 0.7, ",": 0.35, ";": 0.35, ":": 0.35, "—": 0.35, "–": 0.35}


class Unit(NamedTuple):
    """A word or tag of a piece: where it is in the piece's text and in the caller's, and its weight."""

    at: int
    end: int
    start_char: int
    end_char: int
    weight: float


@dataclass(frozen=True)
class Word:
    """An estimated word: its text as spoken, where it is in the caller's text, and when."""

    text: str
    start_char: int
    end_char: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Piece:
    """A piece of the text as spoken, where it is in the caller's text, and its exact span in the audio."""

    index: int  # 0, 1, 2, ... in the stream
    text: str
    start_char: int
    end_char: int
    start_sample: int  # at 24 kHz
    end_sample: int
    units: tuple[Unit, ...] = ()  # its words and tags

    @property
    def start_s(self) -> float:
        return self.start_sample / SAMPLE_RATE

    @property
    def end_s(self) -> float:
        return self.end_sample / SAMPLE_RATE

    def words(self, length_s: float | None = None) -> list[Word]:
        """Its words with estimated times (shared over ``length_s``, by default its own length)."""
        return [w for w, tag in self._timed(length_s) if not tag]

    def _timed(self, length_s: float | None = None) -> list[tuple[Word, bool]]:
        length = self.end_s - self.start_s if length_s is None else length_s
        pauses = [_pause_after(self.text, u.end) for u in self.units[:-1]] + [0.0]  # (none after the last)
        total = sum(u.weight for u in self.units) + sum(pauses) or 1.0
        out, at = [], 0.0
        for u, pause in zip(self.units, pauses, strict=True):
            start_s = self.start_s + length * at / total
            at += u.weight
            end_s = self.start_s + length * at / total
            at += pause
            text = self.text[u.at:u.end]
            out.append((Word(text, u.start_char, u.end_char, start_s, end_s), text.startswith("<")))
        return out

    def alignment(self) -> dict:
        """ElevenLabs' ``alignment`` for its text: each character's start and duration in ms (from the start
        of the stream's audio), the letters of a word sharing its time, a space the gap after it."""
        starts = [self.start_s * 1000.0] * len(self.text)
        durations = [0.0] * len(self.text)
        timed = self._timed()
        for k, (u, (word, _)) in enumerate(zip(self.units, timed, strict=True)):
            step = (word.end_s - word.start_s) * 1000.0 / max(1, u.end - u.at)
            for j in range(u.at, u.end):
                starts[j], durations[j] = word.start_s * 1000.0 + step * (j - u.at), step
            gap_end = timed[k + 1][0].start_s if k + 1 < len(timed) else word.end_s
            for j in range(u.end, self.units[k + 1].at if k + 1 < len(self.units) else len(self.text)):
                starts[j], durations[j] = word.end_s * 1000.0, (gap_end - word.end_s) * 1000.0
        return {"chars": list(self.text), "charStartTimesMs": [round(s, 1) for s in starts],
                "charDurationsMs": [round(d, 1) for d in durations]}

    def as_dict(self, detail: str = "pieces", speed: float = 1.0, sample_rate: int = SAMPLE_RATE) -> dict:
        """The piece as sent to a client: its span (in the output's seconds and samples: ``speed`` divides
        them), with its estimated words (Cartesia's ``word_timestamps``) for ``words`` and ``chars``, and
        ElevenLabs' ``alignment`` for ``chars``."""
        body = {"index": self.index, "text": self.text, "start_char": self.start_char, "end_char": self.end_char,
                "start_s": round(self.start_s / speed, 6), "end_s": round(self.end_s / speed, 6),
                "start_sample": at_output(self.start_sample, sample_rate, speed),
                "end_sample": at_output(self.end_sample, sample_rate, speed)}
        if detail in ("words", "chars"):
            words = self.words()
            body["word_timestamps"] = {"words": [w.text for w in words],
                                       "start": [round(w.start_s / speed, 3) for w in words],
                                       "end": [round(w.end_s / speed, 3) for w in words], "estimated": True}
        if detail == "chars":
            alignment = self.alignment()
            for key in ("charStartTimesMs", "charDurationsMs"):
                alignment[key] = [round(v / speed, 1) for v in alignment[key]]
            body["alignment"] = {**alignment, "estimated": True}
        return body


def at_output(sample: int, sample_rate: int, speed: float = 1.0) -> int:
    """A 24 kHz sample's place in an output at ``sample_rate`` and ``speed``."""
    return round(sample * sample_rate / SAMPLE_RATE / speed)


@dataclass(frozen=True)
class Heard:
    """What a listener heard of a stream: ``seconds`` of its audio."""

    seconds: float
    pieces: list[Piece]  # wholly inside
    words: list[Word]  # estimated: those of the piece it stopped in, wholly inside
    end_char: int  # the caller's text up to here was heard

    def as_dict(self, speed: float = 1.0, **extra: object) -> dict:
        return {"heard_s": round(self.seconds / speed, 6), "end_char": self.end_char, **extra,
                "pieces": [{"index": p.index, "text": p.text, "start_char": p.start_char, "end_char": p.end_char,
                            "start_s": round(p.start_s / speed, 6), "end_s": round(p.end_s / speed, 6)}
                           for p in self.pieces],
                "words": {"words": [w.text for w in self.words], "start": [round(w.start_s / speed, 3) for w in self.words],
                          "end": [round(w.end_s / speed, 3) for w in self.words], "estimated": True}}


@dataclass
class _Pending:
    key: Hashable
    text: str
    start_char: int
    end_char: int
    units: tuple[Unit, ...]
    start_sample: int | None = None
    end_sample: int = 0


class Timeline:
    """A stream's pieces in its audio (one owner: the stream's consumer)."""

    def __init__(self) -> None:
        self._text = ""  # the caller's text not yet located
        self._base = 0  # offset of _text[0] in everything the caller sent
        self._expected: deque[_Pending] = deque()  # located, not finished (the first may have audio)
        self._done: deque[Piece] = deque(maxlen=KEPT)  # finished, in order: the last KEPT of them
        self._finished = 0  # pieces finished in all
        self._taken = 0  # of them, handed out by take()
        self._seconds = 0.0  # audio of every finished piece,
        self._chars = 0  # and its characters (the pace of speech, for an unfinished piece's length)
        self._at = 0  # the end of the audio placed so far, in samples

    def add_text(self, text: str) -> None:
        """The caller's text, as it arrives (everything it sends, in order)."""
        self._text += text

    @property
    def received(self) -> int:
        """Characters of the caller's text added so far."""
        return self._base + len(self._text)

    def expect(self, key: Hashable, text: str, places: tuple[int, ...] | None = None) -> None:
        """A piece that will be spoken next (after those expected before it), as spoken: found in the text now
        (``places``: each of its characters' offsets in the caller's text, where they are known: SSML)."""
        if places is None:
            start, end, places = self._locate(text)
        else:
            places = list(places)
            start, end = (places[0], places[-1] + 1) if places else (self._base, self._base)
            self.consume(end)
        self._expected.append(_Pending(key, text, start, end, _units(text, places, start)))

    def consume(self, upto: int) -> None:
        """The caller's text before offset ``upto`` is used up (an SSML document's markup after its last word)."""
        used = max(0, upto - self._base)
        self._text, self._base = self._text[used:], self._base + used

    def place(self, key: Hashable, samples: int, last: bool = False, before: int = 0, after: int = 0) -> None:
        """As :meth:`audio`, for a chunk whose first ``before`` and last ``after`` samples are silence
        around the piece's speech (SSML breaks): the silence belongs to no piece."""
        self._at += before
        self.audio(key, samples - before - after, last)
        self._at += after

    def audio(self, key: Hashable, samples: int, last: bool = False) -> None:
        """The next ``samples`` of the stream's audio are piece ``key``'s (``last``: its last ones). Pieces
        expected before it that had no audio end here, empty."""
        while self._expected and self._expected[0].key != key:
            self._finish()
        if not self._expected:
            return  # (a piece never expected: nothing to place)
        piece = self._expected[0]
        if piece.start_sample is None:
            piece.start_sample = self._at
        self._at += samples
        piece.end_sample = self._at
        if last:
            self._finish()

    def through(self, key: Hashable) -> None:
        """Piece ``key``'s stream ended: it and every piece before it are finished."""
        while self._expected and any(p.key == key for p in self._expected):
            self._finish()

    def finish(self) -> None:
        """The stream ended: every piece expected is finished (those that had no audio, empty)."""
        while self._expected:
            self._finish()

    def take(self) -> list[Piece]:
        """The pieces finished since the last call (at most the last KEPT)."""
        new = list(self._done)[len(self._done) - min(len(self._done), self._finished - self._taken):]
        self._taken = self._finished
        return new

    def skip(self, text: str) -> None:
        """A piece that will never be spoken (refused): its text is passed over."""
        self._locate(text)

    @property
    def pieces(self) -> list[Piece]:
        """The finished pieces (the last KEPT)."""
        return list(self._done)

    def heard(self, seconds: float) -> Heard:
        """What ``seconds`` of the stream's audio held: whole pieces, then the estimated words of the piece it
        stopped in (an unfinished one's length estimated from the pace of those before it)."""
        limit = round(max(0.0, seconds) * SAMPLE_RATE)
        whole = [p for p in self._done if p.end_sample <= limit and p.end_sample > p.start_sample]
        first = self._done[0] if self._done else self._expected[0] if self._expected else None
        end_char = whole[-1].end_char if whole else first.start_char if first is not None else self._base
        stopped: Piece | None = next((p for p in self._done if p.start_sample < limit < p.end_sample), None)
        length = None
        if stopped is None and self._expected and self._expected[0].start_sample is not None:
            p = self._expected[0]
            stopped = Piece(self._finished, p.text, p.start_char, p.end_char, p.start_sample, p.end_sample, p.units)
            length = max(stopped.end_s - stopped.start_s, self._pace() * len(p.text))
        words = []
        if stopped is not None and stopped.start_sample < limit:
            words = [w for w in stopped.words(length) if w.end_s * SAMPLE_RATE <= min(limit, stopped.end_sample) + 0.5]
            if words:
                end_char = words[-1].end_char
        return Heard(limit / SAMPLE_RATE, whole, words, end_char)

    def _pace(self) -> float:
        """Seconds per character of the pieces finished so far."""
        return self._seconds / self._chars if self._chars else SECONDS_PER_CHAR

    def _finish(self) -> None:
        p = self._expected.popleft()
        start = self._at if p.start_sample is None else p.start_sample
        end = max(start, p.end_sample)
        piece = Piece(self._finished, p.text, p.start_char, p.end_char, start, end, p.units)
        self._done.append(piece)
        self._finished += 1
        self._seconds += piece.end_s - piece.start_s
        self._chars += len(piece.text)

    def _locate(self, text: str) -> tuple[int, int, list[int]]:
        """Where ``text``'s characters are in the caller's text: each non-space character is looked for
        after the one before it (a character the splitting dropped or changed is skipped); the text up
        to the last one found is used up. ``places``: each character's offset, -1 where not found."""
        places, pos = [], 0
        for ch in text:
            if ch.isspace():
                places.append(-1)
                continue
            while pos < len(self._text) and self._text[pos].isspace():  # (a run of spaces the splitting collapsed)
                pos += 1
            found = self._text.find(ch, pos, pos + LOOKAHEAD)
            places.append(self._base + found if found >= 0 else -1)
            if found >= 0:
                pos = found + 1
        found = [p for p in places if p >= 0]
        if not found:
            return self._base, self._base, places
        self._text = self._text[pos:]
        self._base += pos
        return found[0], found[-1] + 1, places


def _units(text: str, places: list[int], start_char: int) -> tuple[Unit, ...]:
    """Each word or tag of ``text`` (``places``: each character's offset in the caller's text, -1 for
    one not found there; such a word takes the place of the one before it)."""
    units, at = [], start_char
    for m in _UNIT.finditer(text):
        found = [places[j] for j in range(m.start(), m.end()) if places[j] >= 0]
        start, end = (found[0], found[-1] + 1) if found else (at, at)
        weight = 1.0 if m.group().startswith("<") else _syllables(m.group())
        units.append(Unit(m.start(), m.end(), start, end, weight))
        at = end
    return tuple(units)


def _syllables(word: str) -> float:
    """A word's spoken length, roughly: its vowel groups (a digit counts as one)."""
    return float(max(1, len(_VOWELS.findall(word)) + sum(c.isdigit() for c in word)))


def _pause_after(text: str, end: int) -> float:
    return _PAUSE.get(text[end - 1], 0.0) if end > 0 else 0.0

