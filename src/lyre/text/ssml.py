"""SSML: the subset Lyre reads (``<speak>``, ``<p>``, ``<s>``, ``<break>``, ``<say-as>``, ``<sub>``,
``<prosody rate>``, ``<lang>``, ``<emphasis>``, ``<phoneme>`` and Orpheus's emotion tags as empty
elements), parsed into :class:`Run` s of the caller's text.

The parser is defusedxml's (a document type declaration, an entity declaration or an external
reference is refused before anything is expanded), with Lyre's own bounds that defusedxml does not
set: nesting depth, element count, attribute length, break length and total silence. Every problem is
a :class:`SsmlError` naming it (and the tag, attribute or line), never anything else.

Each run keeps, for every character of its text, that character's offset in the document
(``places``): timestamps and the "heard" report point into what the caller sent, markup and all.
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass, field
from xml.parsers.expat import ExpatError

from lyre.text.say_as import SAY_AS, say_as

MAX_DEPTH = 32
MAX_ELEMENTS = 2000
MAX_ATTRIBUTE_CHARS = 1024
MAX_BREAK_S = 10.0  # one <break> (Amazon Polly's bound too)
MAX_SILENCE_S = 60.0  # every <break> and paragraph pause of one document together
PARAGRAPH_PAUSE_S = 0.5  # after </p>
STRENGTHS = {"none": 0.0, "x-weak": 0.1, "weak": 0.2, "medium": 0.4, "strong": 0.7, "x-strong": 1.2}
RATES = {"x-slow": 0.6, "slow": 0.8, "medium": 1.0, "default": 1.0, "fast": 1.25, "x-fast": 1.5}
MIN_RATE, MAX_RATE = 0.5, 2.0
EMOTIONS = ("laugh", "chuckle", "sigh", "cough", "sniffle", "groan", "yawn", "gasp")  # Orpheus's tags, as <laugh/>
TAGS = ("speak", "p", "s", "break", "say-as", "sub", "prosody", "lang", "emphasis", "phoneme", "voice", *EMOTIONS)
SSML_NS = "{http://www.w3.org/2001/10/synthesis}"
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
_START = re.compile(r"\s*<(?:\?xml[\s?]|!DOCTYPE|speak[\s>/])")  # (a document type: refused)
_REF = re.compile(r"&(#x[0-9a-fA-F]+|#[0-9]+|[A-Za-z]+);|\r\n?")
_MARKUP = r"<!--.*?-->|<\?.*?\?>|<(?:[^>\"']|\"[^\"]*\"|'[^']*')*>"  # a comment, instruction or tag (quotes and all)
_MARKUP_AT = re.compile(_MARKUP, re.DOTALL)
_MARKUP_OR_REF = re.compile(_MARKUP + "|" + _REF.pattern, re.DOTALL)
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}
_TIME = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*")
_PERCENT = re.compile(r"\s*([+-]?\d+(?:\.\d+)?)%\s*")


class SsmlError(ValueError):
    """A document Lyre does not read, and why."""


def is_ssml(text: str) -> bool:
    """Whether ``text`` is an SSML document: it starts with ``<speak`` (or an XML declaration, or a
    document type declaration, which :func:`parse` refuses), after any whitespace."""
    return bool(_START.match(text[:64]))


@dataclass(frozen=True)
class Run:
    """A stretch of the caller's text, read one way."""

    text: str  # the caller's characters (references such as &amp; decoded)
    places: tuple[int, ...]  # each character's offset in the document
    said: str | None = None  # what is read instead (<say-as>, <sub>, an emotion tag); None: the text itself
    rate: float = 1.0  # <prosody rate>: 1.5 is half as fast again
    language: str | None = None  # <lang xml:lang> / <speak xml:lang>
    pause_before_s: float = 0.0  # silence before it (<break>, a paragraph's end)
    boundary: bool = False  # a sentence or paragraph starts here: never read in one breath with what is before


@dataclass
class Document:
    runs: list[Run] = field(default_factory=list)
    end_pause_s: float = 0.0  # silence after the last run
    unknown: list[str] = field(default_factory=list)  # tags read as their text (lenient)

    @property
    def text(self) -> str:
        return "".join(r.text for r in self.runs)


@dataclass
class _Scope:
    tag: str
    rate: float
    language: str | None
    said: str | None = None  # the element reads as this, not as its text
    depth_said: bool = False  # inside an element whose reading replaces its text
    start: int = 0  # where its content starts in the document


class _Reader:
    """The parser's target: builds the runs as elements open and close (positions from expat)."""

    def __init__(self, source: str, lenient: bool):
        self.source, self.lenient = source, lenient
        self.doc = Document()
        self.stack: list[_Scope] = []
        self.elements = 0
        self.at = 0  # the end of the markup read so far: text after it up to the next tag is the caller's
        self.pause = 0.0  # silence waiting for the next run
        self.paragraph = False  # a paragraph ended: its pause comes before the next run, if one comes
        self.silence = 0.0
        self.boundary = False
        self.parser = None  # the defused parser (set after construction)
        ascii_only = source.isascii()
        self._bytes = None if ascii_only else list(itertools.accumulate(len(c.encode("utf-8")) for c in source))

    # --- positions ---------------------------------------------------------------------------------

    def _here(self) -> int:
        """The character offset of the event expat is reporting."""
        b = self.parser.parser.CurrentByteIndex
        return b if self._bytes is None else bisect.bisect_right(self._bytes, b)

    def _markup_end(self, start: int) -> int:
        """Where the tag (or comment, or processing instruction) starting at ``start`` ends."""
        m = _MARKUP_AT.match(self.source, start)
        return m.end() if m else len(self.source)

    def _text_up_to(self, end: int) -> None:
        """The caller's text from the last markup to ``end`` (a tag's start) becomes a run."""
        start, self.at = self.at, end
        if start < end and self.stack:
            self._add(*self._visible(start, end))

    def _visible(self, start: int, end: int) -> tuple[str, tuple[int, ...]]:
        """The characters the caller wrote from ``start`` to ``end`` (references decoded, any markup
        inside left out), with each one's offset."""
        raw = self.source[start:end]
        text, places, last = [], [], 0
        for m in _MARKUP_OR_REF.finditer(raw):
            text.append(raw[last:m.start()])
            places.extend(range(start + last, start + m.start()))
            if m.group().startswith("&") or m.group().startswith("\r"):
                text.append(_decode(m))
                places.append(start + m.start())
            last = m.end()
        text.append(raw[last:])
        places.extend(range(start + last, end))
        return "".join(text), tuple(places)

    def _add(self, text: str, places: tuple[int, ...], said: str | None = None) -> None:
        scope = self.stack[-1]
        if scope.depth_said and said is None:
            return  # (the text of an element read as something else: its reading came at its start)
        if not text.strip() and said is None:
            if self.doc.runs and not self.pause and not self.boundary and not self.paragraph:  # spaces between words
                self.doc.runs.append(Run(text, places, None, scope.rate, scope.language))
            return
        if self.paragraph:
            self._silence(PARAGRAPH_PAUSE_S)
        self.doc.runs.append(Run(text, places, said, scope.rate, scope.language, self.pause, self.boundary))
        self.pause, self.boundary, self.paragraph = 0.0, False, False

    # --- the parser's callbacks -----------------------------------------------------------------------

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        here = self._here()
        self._text_up_to(here)
        self.at = self._markup_end(here)
        name = tag[len(SSML_NS):] if tag.startswith(SSML_NS) else tag
        self.elements += 1
        if self.elements > MAX_ELEMENTS:
            raise SsmlError(f"SSML has more than {MAX_ELEMENTS} elements")
        if len(self.stack) >= MAX_DEPTH:
            raise SsmlError(f"SSML nests deeper than {MAX_DEPTH} elements (at <{name}>, {self._line(here)})")
        for key, value in attrib.items():
            if len(value) > MAX_ATTRIBUTE_CHARS:
                raise SsmlError(f"SSML attribute {key!r} of <{name}> has {len(value)} characters; at most "
                                f"{MAX_ATTRIBUTE_CHARS} are accepted ({self._line(here)})")
        if not self.stack:
            if name != "speak":
                raise SsmlError(f"an SSML document's root element must be <speak>, not <{name}>")
            self.stack.append(_Scope("speak", 1.0, attrib.get(XML_LANG) or None))
            return
        outer = self.stack[-1]
        scope = _Scope(name, outer.rate, outer.language, depth_said=outer.depth_said)
        self.stack.append(scope)
        if name not in TAGS and not self.lenient:
            raise SsmlError(f"SSML tag <{name}> is not one Lyre reads (it reads {', '.join(f'<{t}>' for t in TAGS[:11])} "
                            f"and the emotion tags); ask for lenient parsing (ssml: lenient) to read unknown tags as "
                            f"their text ({self._line(here)})")
        if outer.depth_said:
            return  # (inside <say-as>/<sub>: its own reading stands)
        try:
            self._open(name, attrib, scope, here)
        except SsmlError as e:
            raise SsmlError(f"{e} ({self._line(here)})") from None

    def _open(self, name: str, attrib: dict[str, str], scope: _Scope, here: int) -> None:
        if name == "break":
            if "time" in attrib:
                seconds = _seconds(attrib["time"])
            else:
                strength = attrib.get("strength", "medium")
                if strength not in STRENGTHS:
                    raise SsmlError(f"<break strength={strength!r}>: takes {', '.join(STRENGTHS)}")
                seconds = STRENGTHS[strength]
            self._silence(seconds)
        elif name in ("p", "s"):
            self.boundary = True
        elif name == "prosody":
            if "rate" in attrib:
                scope.rate = _rate(attrib["rate"], scope.rate)
        elif name == "lang":
            lang = attrib.get(XML_LANG) or attrib.get("lang")
            if not lang:
                raise SsmlError("<lang> needs an xml:lang attribute")
            scope.language = lang
        elif name == "sub":
            if "alias" not in attrib:
                raise SsmlError("<sub> needs an alias attribute")
            scope.said, scope.depth_said, scope.start = attrib["alias"], True, self.at
        elif name == "say-as":
            kind = attrib.get("interpret-as")
            if kind not in SAY_AS:
                raise SsmlError(f"<say-as interpret-as={kind!r}>: takes {', '.join(SAY_AS)}")
            scope.said, scope.depth_said, scope.start = f"\0{kind}\0{attrib.get('format', '')}", True, self.at
        elif name in EMOTIONS:
            self._add("", (), f"<{name}>")
        elif name in ("emphasis", "phoneme", "voice"):
            pass  # read as their text (docs/protocols.md#ssml)
        else:
            self.doc.unknown.append(name)  # (lenient: read as its text; strict refused it in start)

    def end(self, tag: str) -> None:
        here = self._here()
        closing = self.source.startswith("</", here)  # (else an empty element: <break/>)
        scope = self.stack[-1]
        if scope.said is not None and not (len(self.stack) > 1 and self.stack[-2].depth_said):
            text, places = self._visible(scope.start, here)  # (<say-as>, <sub>: read as their reading)
            said = scope.said
            if said.startswith("\0"):
                _, kind, fmt = said.split("\0")
                try:
                    said = say_as(kind, text, fmt, scope.language)
                except ValueError as e:
                    raise SsmlError(f"<say-as interpret-as={kind!r}> cannot read {text[:40]!r}: {e} "
                                    f"({self._line(here)})") from None
            self.stack.pop()
            self._add(text, places, said)
        else:
            self._text_up_to(here)
            self.stack.pop()
        self.at = self._markup_end(here) if closing else self.at
        if scope.depth_said and scope.said is None:
            return  # (inside <say-as>/<sub>: no pause or boundary of its own)
        self.paragraph = self.paragraph or scope.tag == "p"
        if scope.tag in ("p", "s"):
            self.boundary = True

    def comment(self, text: str) -> None:
        here = self._here()
        self._text_up_to(here)
        self.at = self._markup_end(here)

    def pi(self, target: str, text: str) -> None:
        self.comment(text)

    def close(self) -> Document:
        self.doc.end_pause_s, self.pause = self.pause, 0.0
        return self.doc

    # --- helpers ---------------------------------------------------------------------------------------

    def _silence(self, seconds: float) -> None:
        self.silence += seconds
        if self.silence > MAX_SILENCE_S:
            raise SsmlError(f"SSML asks for more than {MAX_SILENCE_S:g} s of silence in all")
        self.pause += seconds

    def _line(self, at: int) -> str:
        return f"line {self.source.count(chr(10), 0, at) + 1}"


def parse(source: str, lenient: bool = False) -> Document:
    """``source`` (an SSML document) as runs of text; SsmlError naming what is wrong with it."""
    from defusedxml import DefusedXmlException
    from defusedxml.ElementTree import DefusedXMLParser

    if "<![CDATA[" in source:
        raise SsmlError("SSML CDATA sections are not accepted: write the text itself (with &lt; and &amp;)")
    try:
        source.encode("utf-8")
    except UnicodeEncodeError:
        raise SsmlError("SSML text is not valid Unicode (it contains a lone surrogate)") from None
    reader = _Reader(source, lenient)
    parser = DefusedXMLParser(target=reader, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    reader.parser = parser
    try:
        parser.feed(source)
        return parser.close()
    except SsmlError:
        raise
    except DefusedXmlException:
        raise SsmlError("SSML may not declare a document type (<!DOCTYPE>) or entities, nor refer to anything "
                        "outside itself") from None
    except (ExpatError, SyntaxError) as e:  # (ParseError is a SyntaxError)
        raise SsmlError(f"SSML is not well-formed XML: {e}") from None
    except (ValueError, IndexError) as e:  # (a malformed tag's end not found, a bad reference)
        raise SsmlError(f"SSML is not well-formed XML: {e}") from None


# --------------------------------------------------------------------------------------------
# attribute values


def _seconds(value: str) -> float:
    m = _TIME.fullmatch(value)
    if not m:
        raise SsmlError(f"<break time={value!r}>: write a length such as 500ms or 2s")
    seconds = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
    if seconds > MAX_BREAK_S:
        raise SsmlError(f"<break time={value!r}>: at most {MAX_BREAK_S:g} s")
    return seconds


def _rate(value: str, outer: float) -> float:
    value = value.strip()
    if value in RATES:
        rate = RATES[value]
    else:
        m = _PERCENT.fullmatch(value)
        if not m:
            raise SsmlError(f"<prosody rate={value!r}>: takes {', '.join(RATES)} or a percentage such as 120%")
        pct = float(m.group(1))
        rate = outer * (1 + pct / 100) if m.group(1)[0] in "+-" else outer * pct / 100
    if not MIN_RATE <= rate <= MAX_RATE:
        raise SsmlError(f"<prosody rate={value!r}>: the rate must come to between {MIN_RATE:g} and {MAX_RATE:g} "
                        f"times the normal ({rate:g})")
    return rate


def _decode(m: re.Match) -> str:
    ref = m.group(1)
    if ref is None:
        return "\n"
    if ref.startswith("#x"):
        return chr(int(ref[2:], 16))
    if ref.startswith("#"):
        return chr(int(ref[1:]))
    return _NAMED[ref]
