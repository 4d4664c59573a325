"""Splitting long input into segments Orpheus follows well (<= ~280 characters each).

Boundaries are tried in order: sentence ends, then clause punctuation, then spaces. An emotion tag
such as ``<laugh>`` is never split and stays with the text around it.
"""

from __future__ import annotations

import re

MAX_SEGMENT_CHARS = 280

_TAG = r"<[a-z]+>"
_SENTENCE_END = re.compile(r"(?<=[.!?…])[\"')\]]*\s+")
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
