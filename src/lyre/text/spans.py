"""Rewritten text that remembers where each part came from: the caller's characters stay the
source of truth for everything reported back (timestamps, what was heard, audit hashes), however
the text was expanded before the model read it."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Piece:
    out_start: int
    out_end: int
    src_start: int
    src_end: int
    copied: bool  # the source's characters as they are (offsets map one to one inside it)


@dataclass
class Rewritten:
    """``text`` (what the model reads) made of ``pieces``, each from a span of ``source``."""

    source: str
    text: str = ""
    pieces: list[Piece] = field(default_factory=list)
    _starts: list[int] = field(default_factory=list, repr=False)  # each piece's out_start (bisected)

    def __post_init__(self) -> None:
        self._starts = [p.out_start for p in self.pieces]

    def source_span(self, start: int, end: int) -> tuple[int, int]:
        """The span of the source that characters ``start``..``end`` of :attr:`text` came from (an
        expansion maps to the whole of what it expanded)."""
        if not self.pieces or end <= start:
            at = self.source_offset(start)
            return at, at
        return self.source_offset(start), self.source_offset(end - 1, end=True)

    def source_offset(self, index: int, end: bool = False) -> int:
        """Where character ``index`` of :attr:`text` came from in the source (``end``: the end of
        that character's source span)."""
        if not self.pieces or index >= len(self.text):
            return min(index, len(self.source)) if not self.pieces else len(self.source)
        i = max(0, bisect.bisect_right(self._starts, index) - 1)
        p = self.pieces[i]
        if p.copied:
            k = min(max(index - p.out_start, 0), p.src_end - p.src_start - (1 if end else 0))
            return p.src_start + k + (1 if end else 0)
        return p.src_end if end else p.src_start


class Builder:
    """Collects a rewriting of ``source`` left to right."""

    def __init__(self, source: str):
        self.source = source
        self._parts: list[str] = []
        self._pieces: list[Piece] = []
        self._length = 0

    def copy(self, start: int, end: int) -> None:
        """The source's characters ``start``..``end`` unchanged."""
        if end > start:
            self._add(self.source[start:end], start, end, True)

    def emit(self, words: str, start: int, end: int) -> None:
        """``words`` said for the source's characters ``start``..``end``."""
        self._add(words, start, end, False)

    def _add(self, text: str, start: int, end: int, copied: bool) -> None:
        if not text:
            return
        self._pieces.append(Piece(self._length, self._length + len(text), start, end, copied))
        self._parts.append(text)
        self._length += len(text)

    def result(self) -> Rewritten:
        return Rewritten(self.source, "".join(self._parts), self._pieces)
