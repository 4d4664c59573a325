"""Splitting text: long input into segments Orpheus follows well (<= ~280 characters each), and
text arriving in pieces (an LLM writing) into pieces to speak as soon as they are complete.

``split_text`` tries boundaries in order: sentence ends, then clause punctuation, then spaces. An
emotion tag such as ``<laugh>`` is never split and stays with the text around it.

``SentenceStream`` finds sentence ends with pysbd (rule-based, nothing downloaded at run time), so
"Dr. Smith", "$3.50", "U.S." and closing quotes stay inside their sentence.
"""

from __future__ import annotations

import functools
import re
import unicodedata

from lyre.errors import InvalidRequest
from lyre.text import normalize, normalizer

MAX_SEGMENT_CHARS = 280

_TAG = r"<[a-z]+>"
# spaces after a sentence end, its closing quotes or brackets staying with it
_SENTENCE_END = re.compile(r"(?:(?<=[.!?…])|(?<=[.!?…][\"')\]])|(?<=[.!?…][\"')\]]{2}))\s+")
_CLAUSE_END = re.compile(r"(?<=[,;:—–])\s+")
_SPACE = re.compile(r"\s+")


def split_text(text: str, max_chars: int = MAX_SEGMENT_CHARS) -> list[str]:
    """``text`` in order as segments of at most ``max_chars`` (a single word longer than that stays
    whole). Whitespace is normalised; empty input gives []."""
    text = _SPACE.sub(" ", text).strip()
    if not text:
        return []
    return [seg for seg in _pack(text, max_chars, [_SENTENCE_END, _CLAUSE_END, _SPACE]) if seg]


def _pack(text: str, max_chars: int, splitters: list[re.Pattern]) -> list[str]:
    if len(text) <= max_chars:
        return [text]
    if not splitters:
        return [text]  # one unbreakable word
    pieces = _split_outside_tags(text, splitters[0])
    segments: list[str] = []
    current = ""
    for piece in pieces:
        if len(piece) > max_chars:
            if current:
                segments.append(current)
                current = ""
            segments += _pack(piece, max_chars, splitters[1:])
            continue
        candidate = f"{current} {piece}" if current else piece
        if len(candidate) <= max_chars:
            current = candidate
        else:
            segments.append(current)
            current = piece
    if current:
        segments.append(current)
    return segments


def _split_outside_tags(text: str, pattern: re.Pattern) -> list[str]:
    """Split at ``pattern`` except inside ``<tag>``s."""
    tags = [(m.start(), m.end()) for m in re.finditer(_TAG, text)]
    pieces, last = [], 0
    for m in pattern.finditer(text):
        if any(a < m.start() < b for a, b in tags):
            continue
        pieces.append(text[last : m.start()].strip())
        last = m.end()
    pieces.append(text[last:].strip())
    return [p for p in pieces if p]


# --------------------------------------------------------------------------------------------
# incremental text


_CLAUSE_BREAK = re.compile(r"[,;:—–][\"')\]]*\s+")  # a clause ends (sentence ends are pysbd's)
_MAY_END = re.compile(r"[.!?…,;:—–\n]")  # a character after which a piece may be complete


@functools.cache
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False, char_span=False)


def sentences(text: str) -> list[str]:
    """``text`` as sentences, whitespace kept (so ``"".join(sentences(t)) == t``)."""
    return _segmenter().segment(text) if text.strip() else []


def pack_sentences(text: str, max_chars: int) -> list[str]:
    """``text``'s sentences packed in order into pieces of at most ``max_chars`` (a longer sentence
    is cut by :func:`split_text`)."""
    pieces: list[str] = []
    current = ""
    for sentence in sentences(text):
        for part in split_text(sentence, max_chars):
            if current and len(current) + 1 + len(part) > max_chars:
                pieces.append(current)
                current = part
            else:
                current = f"{current} {part}" if current else part
    return pieces + [current] if current else pieces


class SentenceStream:
    """Text arriving in pieces, handed out as pieces to speak. The first piece goes out at the first
    complete clause (synthesis starts while the rest is being written); later ones are whole
    sentences, so prosody spans the sentence. A sentence is complete once text follows it (its
    full stop could be "Dr."'s). Every piece is at most ``max_chars`` (cut by :func:`split_text`),
    and text with no sentence end goes out in ``max_chars`` pieces rather than piling up.

    An append costs O(its length) plus, when it may complete a piece, a rescan of the unfinished
    sentence (at most ``max_chars``): never of everything appended before."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._parts: list[str] = []  # the unfinished tail, in the pieces it arrived in
        self._chars = 0
        self._may_end = False  # the tail holds a character after which a piece may be complete
        self._first = True

    @property
    def pending_chars(self) -> int:
        return self._chars

    def append(self, text: str) -> list[str]:
        self._parts.append(text)
        self._chars += len(text)
        self._may_end = self._may_end or bool(_MAY_END.search(text))
        if not (self._may_end and any(c.isspace() for c in text)) and self._chars <= self.max_chars:
            return []  # nothing can have completed: no rescan
        tail = "".join(self._parts)
        found = sentences(tail)
        done, tail = "".join(found[:-1]), (found[-1] if found else "")
        if not done and self._first:  # the first clause starts synthesis
            breaks = list(_CLAUSE_BREAK.finditer(tail))
            if breaks:
                done, tail = tail[: breaks[-1].end()], tail[breaks[-1].end() :]
        pieces = pack_sentences(done, self.max_chars)
        if len(tail) > self.max_chars:  # no sentence end in sight: speak all but the last part
            *more, last = split_text(tail, self.max_chars)
            pieces += more
            tail = last + (" " if tail[-1:].isspace() else "")
        self._keep(tail)
        if pieces:
            self._first = False
        return pieces

    def flush(self) -> list[str]:
        """Everything received so far, as pieces."""
        pieces = pack_sentences("".join(self._parts), self.max_chars)
        self._keep("")
        if pieces:
            self._first = False
        return pieces

    def _keep(self, tail: str) -> None:
        self._parts = [tail] if tail else []
        self._chars = len(tail)
        self._may_end = bool(_MAY_END.search(tail))


def spoken(pieces: list[str], language: str | None, normalization: str | None) -> list[str]:
    """What the model reads for each piece: the piece with numbers, money, dates, ... said as words
    (:func:`lyre.text.normalize`; ``normalization`` auto (None) or on), or as written (off).
    InvalidRequest for on with a language Lyre has no rules for."""
    if normalization == "off":
        return list(pieces)
    lang = language or "auto"
    if normalizer(lang) is None:
        if normalization == "on":
            raise InvalidRequest(f"text_normalization 'on': Lyre has no normalisation rules for language {lang!r} "
                                 "(English only so far); use auto or off")
        return list(pieces)
    return [normalize(p, lang).text if lang != "auto" or latin(p) else p for p in pieces]


def latin(text: str) -> bool:
    """Every letter of ``text`` is a Latin one (language auto: English rules read only such text)."""
    return all(not c.isalpha() or c.isascii() or unicodedata.name(c, "").startswith("LATIN") for c in text)
