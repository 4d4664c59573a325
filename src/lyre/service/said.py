"""What each segment of a synthesis says: the caller's text cut into segments, each with the words
the model reads, and for SSML the silence around it, its rate and its language.

Plain text is cut by :func:`~lyre.service.text.split_text` and normalised piece by piece
(:func:`~lyre.service.text.spoken`). An SSML document (:mod:`lyre.text.ssml`) is cut where it asks
(``<break>``, ``<p>``, ``<s>``, a change of rate or language) and where a segment would pass
``max_chars``; each of its plain runs is normalised on its own, and ``<say-as>`` / ``<sub>`` runs
are read as marked (whatever ``text_normalization`` says)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from lyre.errors import InvalidRequest, TextTooLong
from lyre.service.text import MAX_SEGMENT_CHARS, split_text, spoken
from lyre.text import ssml

if TYPE_CHECKING:
    from lyre.config import LyreConfig
    from lyre.service.options import SynthesisRequest
    from lyre.text.pls import Aliases

MAX_SEGMENTS = 64  # of one SSML document (each is a prompt the model reads)
_NO_SPACE_BEFORE = re.compile(r" ([,.;:!?…])")
_CUTS = (re.compile(r"[.!?…][\"')\]]*\s+"), re.compile(r"[,;:—–]\s+"), re.compile(r"\s+"))


@dataclass(frozen=True)
class Said:
    """One segment: the caller's characters and what the model reads for them."""

    text: str  # the caller's text (timestamps and the heard report refer to it)
    spoken: str  # what the model reads
    places: tuple[int, ...] | None = None  # each character of text's offset in the caller's text (SSML); None: found
    pause_before_s: float = 0.0  # silence before its audio
    pause_after_s: float = 0.0  # and after
    rate: float = 1.0  # its audio plays this many times faster (<prosody rate>), pitch kept
    language: str | None = None  # <lang>: in place of the request's


def is_document(text: str, mode: str | None) -> bool:
    """Whether ``text`` is read as an SSML document (it starts with <speak>; the request's ``ssml`` is not off)."""
    return mode != "off" and ssml.is_ssml(text)


def of_request(request: SynthesisRequest, cfg: LyreConfig, aliases: Aliases | None = None) -> tuple[list[Said], int]:
    """A synthesis request's text as segments, and the characters it is charged for (an SSML
    document's: what each segment says or reads, the longer of the two; its markup not counted). TextTooLong past the profile's ``max_text_chars``
    (an SSML document: past ``server.max_input_chars``, as it is spoken as one synthesis). ``aliases``:
    a lexicon's words read in place of the caller's, before normalisation (SSML: in its plain text)."""
    limit = cfg.active_profile.max_text_chars
    if is_document(request.text, request.ssml):
        most = max(limit, cfg.server.max_input_chars)
        if len(request.text) > most:
            raise TextTooLong(f"the SSML document has {len(request.text)} characters; at most {most} are accepted "
                              "(server.max_input_chars)")
        try:
            doc = ssml.parse(request.text, lenient=request.ssml == "lenient")
        except ssml.SsmlError as e:
            raise InvalidRequest(str(e)) from None
        said = from_ssml(doc, MAX_SEGMENT_CHARS, request.language, request.text_normalization, aliases)
        return said, sum(max(len(s.text), len(s.spoken)) for s in said)
    if len(request.text) > limit:
        raise TextTooLong(f"text has {len(request.text)} characters; the '{cfg.profile}' profile accepts at most {limit}")
    return (plain(request.text, MAX_SEGMENT_CHARS, request.language, request.text_normalization, aliases),
            len(request.text))


def plain(text: str, max_chars: int, language: str | None, normalization: str | None,
          aliases: Aliases | None = None) -> list[Said]:
    pieces = split_text(text, max_chars)
    read = [aliases.apply(p) for p in pieces] if aliases else pieces
    return [Said(p, s) for p, s in zip(pieces, spoken(read, language, normalization), strict=True)]


def from_ssml(doc: ssml.Document, max_chars: int, language: str | None, normalization: str | None,
              aliases: Aliases | None = None) -> list[Said]:
    """``doc``'s runs as segments; InvalidRequest when it has nothing to say."""
    groups: list[list[ssml.Run]] = []
    for run in doc.runs:
        first = groups[-1][0] if groups else None
        if first is None or run.pause_before_s or (run.rate, run.language) != (first.rate, first.language):
            groups.append([])  # (a new <s> starts none: sentences pack together, as plain text's do)
        if run.said is not None and len(run.said) > max_chars:
            raise InvalidRequest(f"an SSML <say-as> or <sub> reads as {len(run.said)} characters; at most {max_chars} "
                                 "are accepted (write longer text as text)")
        groups[-1] += _windows(run, max_chars) if run.said is None else [run]
    out: list[Said] = []
    pause = 0.0
    for group in groups:
        pause += group[0].pause_before_s
        for part in _pack(group, max_chars):
            said = _said(part, language, normalization, aliases)
            if said is None:
                continue
            out.append(Said(said[0], said[1], said[2], pause, 0.0, part[0].rate, part[0].language))
            pause = 0.0
    if not out:
        raise InvalidRequest("the SSML document has no text to speak")
    if len(out) > MAX_SEGMENTS:
        raise InvalidRequest(f"the SSML document is cut into {len(out)} segments (at its breaks, rate and language "
                             f"changes); at most {MAX_SEGMENTS} are accepted")
    out[-1] = replace(out[-1], pause_after_s=pause + doc.end_pause_s)
    return out


def _windows(run: ssml.Run, max_chars: int) -> list[ssml.Run]:
    """A plain run longer than ``max_chars`` cut at sentence ends, else clause ends, else spaces."""
    out, text, places = [], run.text, run.places
    while len(text) > max_chars:
        cut = next((m.end() for pattern in _CUTS for m in reversed(list(pattern.finditer(text, 0, max_chars)))),
                   max_chars)
        out.append(ssml.Run(text[:cut], places[:cut], None, run.rate, run.language, run.pause_before_s, run.boundary))
        text, places = text[cut:], places[cut:]
        run = ssml.Run("", (), None, run.rate, run.language)
    out.append(ssml.Run(text, places, None, run.rate, run.language, run.pause_before_s, run.boundary))
    return out


def _pack(runs: list[ssml.Run], max_chars: int) -> list[list[ssml.Run]]:
    parts: list[list[ssml.Run]] = [[]]
    size = 0
    for run in runs:
        n = max(len(run.text), len(run.said or ""))
        if parts[-1] and size + n > max_chars:
            parts.append([])
            size = 0
        parts[-1].append(run)
        size += n
    return parts


def _said(runs: list[ssml.Run], language: str | None, normalization: str | None, aliases: Aliases | None):
    """(text, spoken, places) of a segment's runs, whitespace collapsed; None when it says nothing."""
    text, places, words = [], [], []
    for run in runs:
        if run.boundary and text and text[-1] and not text[-1][-1].isspace():  # (<s>a.</s><s>b.</s>: "a. b.")
            text.append(" ")
            places.append(run.places[0] if run.places else places[-1] if places else 0)
            words.append(" ")
        text.append(run.text)
        places += run.places
        text_read = aliases.apply(run.text) if aliases and run.said is None else run.text
        words.append(f" {run.said} " if run.said is not None else spoken([text_read], run.language or language,
                                                                         normalization)[0])
    said = _NO_SPACE_BEFORE.sub(r"\1", " ".join("".join(words).split()))  # (" one ," of a marked run: "one,")
    if not said:
        return None
    joined, kept = "".join(text), []
    out = []
    for ch, at in zip(joined, places, strict=True):
        if ch.isspace():
            if out and out[-1] != " ":
                out.append(" ")
                kept.append(at)
            continue
        out.append(ch)
        kept.append(at)
    while out and out[-1] == " ":
        out.pop()
        kept.pop()
    return "".join(out), said, tuple(kept)
