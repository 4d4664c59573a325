"""The text front end (issue 32): what the caller wrote becomes what the model should say, and every
part of what it says maps back to the caller's characters (:mod:`.spans`).

``normalize(text, language)`` verbalises numbers, money, dates, times, telephone numbers, web
addresses, units, abbreviations and identifiers (:mod:`.english`; English only so far: another
language's text is kept as written, and adding one is adding its rules, not changing callers).
Pure Python, no model, no I/O: cheap enough to run per sentence off the engine thread.
"""

from __future__ import annotations

from functools import lru_cache

from lyre.text.english import English
from lyre.text.spans import Builder, Rewritten

DAY_FIRST_REGIONS = ("GB", "UK", "IE", "AU", "NZ", "IN", "ZA", "SG", "HK")  # 03/04 is the 3rd of April there


@lru_cache(maxsize=8)
def normalizer(language: str) -> English | None:
    """The normaliser of a BCP-47 ``language`` (en, en-US, en-GB, ... or a model family's name,
    "english"), or None where Lyre has no rules for it."""
    primary, _, region = language.replace("_", "-").partition("-")
    if primary.lower() not in ("en", "english", "auto", ""):
        return None
    return English(day_first=region.upper() in DAY_FIRST_REGIONS)


def normalize(text: str, language: str = "en") -> Rewritten:
    """``text`` as it should be said in ``language``; kept as written where Lyre has no rules for it."""
    english = normalizer(language)
    if english is None:
        out = Builder(text)
        out.copy(0, len(text))
        return out.result()
    return english.normalize(text)


__all__ = ["Rewritten", "normalize", "normalizer"]
