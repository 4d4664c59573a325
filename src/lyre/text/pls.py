"""W3C Pronunciation Lexicon Specification (PLS 1.0) lexicons: parsed (defusedxml, as SSML), and
their ``<alias>`` entries applied to text before it is normalised.

    <lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"
             alphabet="ipa" xml:lang="en-US">
      <lexeme><grapheme>Lyre</grapheme><alias>liar</alias></lexeme>
      <lexeme><grapheme>W3C</grapheme><alias>World Wide Web Consortium</alias></lexeme>
      <lexeme><grapheme>tomato</grapheme><phoneme>təˈmeɪtoʊ</phoneme></lexeme>
    </lexicon>

A lexeme with an alias has its graphemes replaced by the alias wherever they stand as whole words
(case-sensitive, as Amazon Polly matches). A lexeme with only phonemes is kept and counted, and read
as written: no model family Lyre serves takes phonemes. Every problem is a :class:`PlsError`
naming its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.parsers.expat import ExpatError

PLS_NS = "{http://www.w3.org/2005/01/pronunciation-lexicon}"
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
MAX_LEXEMES = 5000
MAX_GRAPHEME_CHARS = 100
_PUNCT = ".,;:!?…\"')]"


class PlsError(ValueError):
    """A lexicon that is not valid PLS, and why."""


@dataclass(frozen=True)
class Lexeme:
    graphemes: tuple[str, ...]
    alias: str | None
    phonemes: tuple[str, ...]


@dataclass
class Lexicon:
    language: str
    alphabet: str
    lexemes: list[Lexeme] = field(default_factory=list)

    @property
    def aliases(self) -> int:
        return sum(1 for x in self.lexemes if x.alias is not None)

    @property
    def phonemes(self) -> int:
        """Lexemes read only by phonemes (which no family served here takes: unused)."""
        return sum(1 for x in self.lexemes if x.alias is None and x.phonemes)


class _Reader:
    def __init__(self) -> None:
        self.parser = None
        self.stack: list[str] = []
        self.lexicon: Lexicon | None = None
        self.lexeme: dict[str, list[str]] | None = None
        self.lexeme_line = 0
        self.text: list[str] = []

    def _line(self) -> int:
        return self.parser.parser.CurrentLineNumber

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        name = tag[len(PLS_NS):] if tag.startswith(PLS_NS) else tag
        where = self.stack[-1] if self.stack else None
        self.stack.append(name)
        self.text = []
        if where is None:
            if name != "lexicon":
                raise PlsError(f"line {self._line()}: the root element must be <lexicon>, not <{name}>")
            if attrib.get("version") != "1.0":
                raise PlsError(f"line {self._line()}: <lexicon> needs version=\"1.0\"")
            language = attrib.get(XML_LANG)
            if not language:
                raise PlsError(f"line {self._line()}: <lexicon> needs xml:lang (the language of its graphemes)")
            self.lexicon = Lexicon(language, attrib.get("alphabet", ""))
        elif where == "lexicon" and name == "lexeme":
            if len(self.lexicon.lexemes) >= MAX_LEXEMES:
                raise PlsError(f"line {self._line()}: more than {MAX_LEXEMES} lexemes")
            self.lexeme, self.lexeme_line = {"grapheme": [], "alias": [], "phoneme": []}, self._line()
        elif where == "lexeme" and name in ("grapheme", "alias", "phoneme"):
            pass
        elif where == "lexicon" and name == "meta" or where == "lexicon" and name == "metadata" or name == "example":
            pass
        elif "metadata" in self.stack[:-1]:
            pass  # (any markup of its own)
        else:
            raise PlsError(f"line {self._line()}: <{name}> is not a PLS element here (inside <{where}>)")

    def data(self, text: str) -> None:
        self.text.append(text)

    def end(self, tag: str) -> None:
        name = self.stack.pop()
        text = " ".join("".join(self.text).split())
        self.text = []
        if self.lexeme is not None and name in ("grapheme", "alias", "phoneme"):
            if not text:
                raise PlsError(f"line {self._line()}: an empty <{name}>")
            if name == "grapheme" and len(text) > MAX_GRAPHEME_CHARS:
                raise PlsError(f"line {self._line()}: a grapheme over {MAX_GRAPHEME_CHARS} characters")
            self.lexeme[name].append(text)
        elif name == "lexeme":
            x = self.lexeme
            if not x["grapheme"]:
                raise PlsError(f"line {self.lexeme_line}: a <lexeme> without a <grapheme>")
            if not x["alias"] and not x["phoneme"]:
                raise PlsError(f"line {self.lexeme_line}: a <lexeme> with neither an <alias> nor a <phoneme>")
            self.lexicon.lexemes.append(Lexeme(tuple(x["grapheme"]), x["alias"][0] if x["alias"] else None,
                                               tuple(x["phoneme"])))
            self.lexeme = None

    def close(self) -> Lexicon:
        return self.lexicon


def parse(text: str) -> Lexicon:
    """``text`` (a PLS document) as a :class:`Lexicon`; PlsError naming the line of what is wrong."""
    from defusedxml import DefusedXmlException
    from defusedxml.ElementTree import DefusedXMLParser

    if not isinstance(text, str) or not text.strip():
        raise PlsError("the lexicon is empty: send a PLS document (<lexicon version=\"1.0\" ...>)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PlsError("the lexicon is not valid Unicode (it contains a lone surrogate)") from None
    reader = _Reader()
    parser = DefusedXMLParser(target=reader, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    reader.parser = parser
    try:
        parser.feed(text)
        lexicon = parser.close()
    except PlsError:
        raise
    except DefusedXmlException:
        raise PlsError("a lexicon may not declare a document type (<!DOCTYPE>) or entities, nor refer to anything "
                       "outside itself") from None
    except (ExpatError, SyntaxError) as e:
        raise PlsError(f"not well-formed XML: {e}") from None
    if lexicon is None:
        raise PlsError("no <lexicon> element")
    return lexicon


class Aliases:
    """The ``<alias>`` entries of lexicons in order (the first lexicon that names a grapheme wins), applied
    as whole words. Applying costs a dictionary lookup per word of the text."""

    def __init__(self, lexicons: list[Lexicon]):
        self._by_first: dict[str, list[tuple[str, str]]] = {}  # a grapheme's first word -> (grapheme, alias), longest first
        seen: set[str] = set()
        for lexicon in lexicons:
            for x in lexicon.lexemes:
                for g in x.graphemes:
                    if x.alias is None or g in seen:
                        continue
                    seen.add(g)
                    self._by_first.setdefault(g.split(" ", 1)[0], []).append((g, x.alias))
        for entries in self._by_first.values():
            entries.sort(key=lambda e: -len(e[0]))

    def __bool__(self) -> bool:
        return bool(self._by_first)

    def apply(self, text: str) -> str:
        if not self._by_first:
            return text
        out, last = [], 0
        for m in _WORD.finditer(text):
            if m.start() < last:
                continue  # (inside a grapheme of several words already replaced)
            word = m.group()
            entries = self._by_first.get(word) or self._by_first.get(word.rstrip(_PUNCT))
            if not entries:
                continue
            for grapheme, alias in entries:
                end = m.start() + len(grapheme)
                if text.startswith(grapheme, m.start()) and (end == len(text) or not text[end].isalnum()):
                    out += [text[last:m.start()], alias]
                    last = end
                    break
        return "".join(out) + text[last:]


_WORD = re.compile(r"(?<![^\s(\[\"'“‘])[^\s(\[\"'“‘]\S*")  # a word: after a space, an opening bracket or quote
