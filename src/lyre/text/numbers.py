"""English number words: cardinals, ordinals, years, digits one by one (American style: no "and"
inside a number, hyphenated tens)."""

from __future__ import annotations

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen").split()
TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
SCALES = ("", "thousand", "million", "billion", "trillion", "quadrillion")
IRREGULAR_ORDINALS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                      "nine": "ninth", "twelve": "twelfth"}
MAX_CARDINAL = 10**18 - 1  # read as a number up to here; longer runs of digits are read digit by digit


def _below_thousand(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    words = [f"{ONES[hundreds]} hundred"] if hundreds else []
    if rest:
        words.append(ONES[rest] if rest < 20 else TENS[rest // 10] + (f"-{ONES[rest % 10]}" if rest % 10 else ""))
    return " ".join(words)


def cardinal(n: int) -> str:
    """1234 -> "one thousand two hundred thirty-four"; negatives "minus ..."."""
    if n < 0:
        return "minus " + cardinal(-n)
    if n == 0:
        return "zero"
    if n > MAX_CARDINAL:
        return digits(str(n))
    groups, scale = [], 0
    while n:
        n, group = divmod(n, 1000)
        if group:
            groups.append(_below_thousand(group) + (f" {SCALES[scale]}" if scale else ""))
        scale += 1
    return " ".join(reversed(groups))


def ordinal(n: int) -> str:
    """21 -> "twenty-first"."""
    words = cardinal(n)
    head, sep, last = words.rpartition(" ")
    stem, hyphen, unit = last.rpartition("-")
    unit = IRREGULAR_ORDINALS.get(unit) or (unit[:-1] + "ieth" if unit.endswith("y") else unit + "th")
    return head + sep + stem + hyphen + unit


def digits(text: str) -> str:
    """"0100" -> "zero one zero zero"."""
    return " ".join(ONES[int(c)] for c in text if c.isdigit())


def year(n: int) -> str:
    """2027 -> "twenty twenty-seven", 2005 -> "two thousand five", 1905 -> "nineteen oh five",
    1900 -> "nineteen hundred"."""
    if not 1000 <= n <= 9999 or (2000 <= n <= 2009) or n % 1000 == 0:
        return cardinal(n)
    high, low = divmod(n, 100)
    if low == 0:
        return f"{cardinal(high)} hundred"
    return f"{cardinal(high)} {'oh ' + ONES[low] if low < 10 else cardinal(low)}"


def decimal(text: str) -> str:
    """"3.14" -> "three point one four"; "1,234.5" -> "one thousand two hundred thirty-four point five"."""
    whole, _, fraction = text.replace(",", "").partition(".")
    words = cardinal(int(whole)) if whole else "zero"
    return f"{words} point {digits(fraction)}" if fraction else words
