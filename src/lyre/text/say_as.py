"""SSML's ``<say-as>``: text read as the kind of thing the caller says it is (the kinds Amazon Polly,
Azure and Google take in common)."""

from __future__ import annotations

import re

from lyre.text import numbers

SAY_AS = ("characters", "spell-out", "cardinal", "number", "ordinal", "digits", "date", "time", "telephone", "currency")

_LETTER_NAMES = {"-": "dash", ".": "dot", "@": "at", "_": "underscore", "/": "slash", "+": "plus", "#": "hash",
                 "*": "star", "&": "and"}


def say_as(kind: str, text: str, fmt: str = "", language: str | None = None) -> str:
    """``text`` read as ``kind`` (SAY_AS); text that is not one (say-as cardinal "abc") is read as
    written, normalised."""
    from lyre.text import normalize

    t = text.strip()
    if kind in ("characters", "spell-out"):
        return " ".join(numbers.ONES[int(c)] if c in "0123456789" else _LETTER_NAMES.get(c, c.upper())
                        for c in t if not c.isspace())
    if kind == "digits":
        found = "".join(c for c in t if c in "0123456789")
        return numbers.digits(found) if found else t
    plain = t.replace(",", "")
    if kind in ("cardinal", "number") and re.fullmatch(r"-?[0-9]{1,18}(?:\.[0-9]+)?", plain):
        negative, plain = plain.startswith("-"), plain.lstrip("-")
        words = numbers.decimal(plain) if "." in plain else numbers.cardinal(int(plain))
        return ("minus " if negative else "") + words
    if kind == "ordinal" and re.fullmatch(r"[0-9]{1,18}(?:st|nd|rd|th)?", plain):
        return numbers.ordinal(int(re.sub(r"\D", "", plain)))
    if kind == "telephone":
        groups = re.findall(r"[0-9]+", t)
        if groups:
            return ("plus " if t.startswith("+") else "") + ", ".join(numbers.digits(g) for g in groups)
    if kind == "date":
        said = _date(t, fmt)
        if said:
            return said
    return normalize(t, language or "en").text


def _date(text: str, fmt: str) -> str | None:
    """A numeric date in ``fmt`` order (mdy, dmy, ymd, md, dm, ym, my, y; default mdy) as words."""
    from lyre.text.english import MONTHS

    parts = re.findall(r"\d+", text)
    order = (fmt or "mdy").lower()
    if len(parts) != len(order) or any(c not in "dmy" for c in order):
        return None
    got = dict(zip(order, (int(p) for p in parts), strict=True))
    month, day, year = got.get("m"), got.get("d"), got.get("y")
    if (month is not None and not 1 <= month <= 12) or (day is not None and not 1 <= day <= 31):
        return None
    if day is not None and (month is None or order.index("d") < order.index("m")):  # (dmy: the third of April)
        said = f"the {numbers.ordinal(day)}" + (f" of {MONTHS[month - 1]}" if month is not None else "")
    else:
        said = " ".join(w for w in (MONTHS[month - 1] if month is not None else "",
                                    numbers.ordinal(day) if day is not None else "") if w)
    if year is not None:
        said = f"{said}, {numbers.year(year)}" if said else numbers.year(year)
    return said
