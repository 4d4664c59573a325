"""English text normalisation: what is written becomes what is said, in one left-to-right pass.

Each rule is a regular expression and a function that says what it matched; the rules are tried
in order at each position (the first that matches there wins), and text no rule matches is kept
as written. What each rule covers, with examples (``tests/text/corpus_en.py`` holds the rest):

- web: URLs ("www.example.com/help" -> "w w w dot example dot com slash help"), e-mail addresses
- telephone numbers: grouped digits ("+1 415 555 0100" -> "plus one, four one five, five five five,
  zero one zero zero"); "(415) 555-0100", "1-800-555-0199", "555-0100"
- dates: "03/04/2027" (month first; ``day_first`` for en-GB and the like), "2027-03-04",
  "March 4, 2027", "4 March 2027", "Jan. 5th"
- times: "3:30 pm", "15:45", "9:05", "10am"
- money: "$1,234.50", "€20", "£3.50", "¥1000", "USD 20", "15 EUR", "$2.5 million"
- percentages, units ("5 km", "3.5 GB", "20°C", "60 km/h"), ordinals ("22nd"), ranges ("1-2"),
  negatives ("-5"), decimals ("3.14"), cardinals ("1,234"; long digit runs and leading zeros are
  read digit by digit: account numbers), years after "in", "since", ... ("in 2027")
- identifiers mixing letters and digits, spelled ("4471-22B" -> "four four seven one, two two B")
- titles and abbreviations ("Dr. Smith" -> "Doctor Smith", "St. Louis", "Main St.", "No. 5", "e.g.")

An Orpheus emotion tag (``<laugh>``) is kept as written.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from lyre.text.numbers import ONES, cardinal, decimal, digits, ordinal, year
from lyre.text.spans import Builder, Rewritten

MONTHS = ("January February March April May June July August September October November December").split()
_MONTH = (r"(?P<{}>Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
          r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?")
# ISO 4217 code -> (one, many, hundredth one, hundredth many)
CURRENCIES = {
    "USD": ("dollar", "dollars", "cent", "cents"), "EUR": ("euro", "euros", "cent", "cents"),
    "GBP": ("pound", "pounds", "penny", "pence"), "JPY": ("yen", "yen", "", ""),
    "CAD": ("Canadian dollar", "Canadian dollars", "cent", "cents"),
    "AUD": ("Australian dollar", "Australian dollars", "cent", "cents"),
    "CHF": ("Swiss franc", "Swiss francs", "centime", "centimes"), "CNY": ("yuan", "yuan", "fen", "fen"),
    "INR": ("rupee", "rupees", "paisa", "paise"), "MXN": ("Mexican peso", "Mexican pesos", "centavo", "centavos"),
}
SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY", "₹": "INR"}
SCALE_WORDS = {"k": "thousand", "thousand": "thousand", "m": "million", "mn": "million", "million": "million",
               "b": "billion", "bn": "billion", "billion": "billion"}
UNITS = {  # written -> (one, many)
    "km/h": ("kilometer per hour", "kilometers per hour"), "mph": ("mile per hour", "miles per hour"),
    "km": ("kilometer", "kilometers"), "cm": ("centimeter", "centimeters"), "mm": ("millimeter", "millimeters"),
    "kg": ("kilogram", "kilograms"), "mg": ("milligram", "milligrams"), "lb": ("pound", "pounds"),
    "lbs": ("pound", "pounds"), "oz": ("ounce", "ounces"), "ft": ("foot", "feet"), "mi": ("mile", "miles"),
    "ml": ("milliliter", "milliliters"), "mL": ("milliliter", "milliliters"),
    "KB": ("kilobyte", "kilobytes"), "kB": ("kilobyte", "kilobytes"), "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"), "TB": ("terabyte", "terabytes"), "Mbps": ("megabit per second",
                                                                               "megabits per second"),
    "kWh": ("kilowatt hour", "kilowatt hours"), "kW": ("kilowatt", "kilowatts"), "Hz": ("hertz", "hertz"),
    "kHz": ("kilohertz", "kilohertz"), "MHz": ("megahertz", "megahertz"), "GHz": ("gigahertz", "gigahertz"),
    "°C": ("degree Celsius", "degrees Celsius"), "°F": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°": ("degree", "degrees"),
}
ABBREVIATIONS = {"Dr": "Doctor", "Mr": "Mister", "Mrs": "Missus", "Ms": "Miz", "Prof": "Professor", "Jr": "Junior",
                 "Sr": "Senior", "Mt": "Mount", "Ave": "Avenue", "Rd": "Road", "Blvd": "Boulevard",
                 "Apt": "Apartment", "Dept": "Department", "approx": "approximately", "etc": "et cetera",
                 "vs": "versus", "e.g": "for example", "i.e": "that is", "Inc": "Incorporated", "Ltd": "Limited"}
YEAR_CUES = ("in", "since", "until", "by", "from", "of", "before", "after", "year", "during", "through")
WEB_SYMBOLS = {".": "dot", "/": "slash", "-": "dash", "_": "underscore", ":": "colon", "?": "question mark",
               "=": "equals", "&": "and", "+": "plus", "#": "hash", "~": "tilde", "%": "percent"}
NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"


def _plural(value: str, one: str, many: str) -> str:
    return one if value.replace(",", "") in ("1", "1.0") else many


def _amount(text: str) -> str:
    return decimal(text) if "." in text else cardinal(int(text.replace(",", "")))


# --- rules --------------------------------------------------------------------------------------


def _web(m: re.Match) -> str:
    text = re.sub(r"^https?://", "", m.group(0), flags=re.I)
    words = []
    for part in re.findall(r"[A-Za-z]+|\d+|[^A-Za-z\d]", text):
        if part.lower() == "www":
            words.append("w w w")
        elif part == "@":
            words.append("at")
        elif part.isdigit():
            words.append(digits(part))
        elif part.isalpha():
            words.append(part.lower() if not part.isupper() or len(part) > 3 else " ".join(part))
        else:
            words.append(WEB_SYMBOLS.get(part, ""))
    return " ".join(w for w in words if w)


def _phone(m: re.Match) -> str:
    text = m.group(0)
    plus = text.startswith("+")
    groups = re.findall(r"\d+", text)
    return ("plus " if plus else "") + ", ".join(digits(g) for g in groups)


def _month(name: str) -> str:
    return next(full for full in MONTHS if full.lower().startswith(name.lower()[:3]))


def _numeric_date(m: re.Match, day_first: bool) -> str | None:
    a, b, y = int(m["d1"]), int(m["d2"]), m["d3"]
    month, day = (b, a) if day_first or a > 12 else (a, b)
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    full = int(y) + (2000 if len(y) == 2 else 0)
    return f"{MONTHS[month - 1]} {ordinal(day)}, {year(full)}"


def _iso_date(m: re.Match) -> str | None:
    y, month, day = int(m["iy"]), int(m["im"]), int(m["id"])
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    return f"{MONTHS[month - 1]} {ordinal(day)}, {year(y)}"


def _month_day(m: re.Match) -> str:
    said = f"{_month(m['mm'])} {ordinal(int(m['md']))}"
    return said + (f", {year(int(m['my']))}" if m["my"] else "")


def _day_month(m: re.Match) -> str:
    said = f"the {ordinal(int(m['dd']))} of {_month(m['dm'])}"
    return said + (f", {year(int(m['dy']))}" if m["dy"] else "")


def _money(m: re.Match) -> str:
    code = SYMBOLS.get(m["sym"] or "") or (m["iso1"] or m["iso2"]).upper()
    amount = m["amt1"] or m["amt2"] or m["amt3"]
    scale = SCALE_WORDS.get((m["scale"] or "").lower())
    one, many, cent, cents = CURRENCIES[code]
    if scale:
        return f"{_amount(amount)} {scale} {many}"
    whole, _, fraction = amount.replace(",", "").partition(".")
    words = []
    if int(whole or 0) or not fraction or not cent:
        words.append(f"{cardinal(int(whole or 0))} {one if int(whole or 0) == 1 else many}")
    if fraction and cent and int(fraction[:2].ljust(2, "0")):
        hundredths = int(fraction[:2].ljust(2, "0"))
        words.append(f"{cardinal(hundredths)} {cent if hundredths == 1 else cents}")
    return " and ".join(words)


def _percent(m: re.Match) -> str:
    return f"{_amount(m['pct'])} percent"


def _unit(m: re.Match) -> str:
    one, many = UNITS[m["unit"]]
    return f"{_amount(m['qty'])} {_plural(m['qty'], one, many)}"


def _range(m: re.Match) -> str:
    return f"{cardinal(int(m['r1']))} to {cardinal(int(m['r2']))}"


def _identifier(m: re.Match) -> str:
    parts = []
    for chunk in m.group(0).split("-"):
        parts.append(" ".join(ONES[int(c)] if c.isdigit() else c.upper() for c in chunk))
    return ", ".join(parts)


def _number(m: re.Match, text: str) -> str:
    written = m.group(0)
    plain = written.replace(",", "")
    if "." in plain:
        return decimal(plain)
    if "," not in written and (len(plain) > 6 or (len(plain) > 1 and plain.startswith("0"))):
        return digits(plain)
    before = text[max(0, m.start() - 12): m.start()].split()
    if len(plain) == 4 and before and before[-1].lower() in YEAR_CUES and 1100 <= int(plain) <= 2099:
        return year(int(plain))
    return cardinal(int(plain))


def _abbreviation(m: re.Match, text: str) -> str | None:
    word = m["abbr"]
    after = text[m.end():m.end() + 2]
    if word == "St":  # "123 Main St." and "Main St. No. 5": a street; "at St. Louis": a saint
        before = text[:m.start()].split()
        return "Street" if before and before[-1][:1].isupper() or not re.match(r"\s[A-Z]", after) else "Saint"
    if word == "No":
        return "number" if re.match(r"\s?\d", after) else None
    return ABBREVIATIONS.get(word)


Rule = tuple[str, Callable]


def rules(day_first: bool = False) -> list[Rule]:
    """(pattern with named groups, function of the match and the text) in the order they are tried."""
    num = rf"(?:{NUMBER})"
    return [
        (r"<[a-z_]+>", lambda m, t: None),  # an Orpheus emotion tag: as written
        # (every repetition bounded: no input makes a rule scan far from where it starts)
        (r"(?<![\w.])(?:https?://|www\.)[^\s<>\"]{0,2000}[^\s<>\".,;:!?)'\]]", lambda m, t: _web(m)),
        (r"(?<![\w.+-])[A-Za-z0-9][\w.+-]{0,63}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){1,8}(?![\w-])",
         lambda m, t: _web(m)),
        (r"(?<![\w+])(?:\+\d{1,3}(?:[ .-]\(?\d{1,6}\)?){2,5}|(?:1[ .-])?(?:\(\d{3}\) ?|\d{3}[ .-])\d{3}[ .-]\d{4}"
         r"|\d{3}-\d{4})(?![\w/-])", lambda m, t: _phone(m)),
        (r"(?<![\w/.])(?P<iy>\d{4})-(?P<im>\d{2})-(?P<id>\d{2})(?![\w/-])", lambda m, t: _iso_date(m)),
        (r"(?<![\w/.])(?P<d1>\d{1,2})[/.](?P<d2>\d{1,2})[/.](?P<d3>\d{4}|\d{2})(?![\w/]|\.\d)",
         lambda m, t: _numeric_date(m, day_first)),
        (r"\b" + _MONTH.format("mm") + r"\s+(?P<md>\d{1,2})(?:st|nd|rd|th)?\b(?:,?\s+(?P<my>\d{4})\b)?",
         lambda m, t: _month_day(m)),
        (r"\b(?P<dd>\d{1,2})(?:st|nd|rd|th)?\s+" + _MONTH.format("dm") + r"(?:,?\s+(?P<dy>\d{4}))?\b",
         lambda m, t: _day_month(m)),
        (r"\b(?P<h>[01]?\d|2[0-3]):(?P<min>[0-5]\d)(?:\s*(?P<ap>[AaPp](?:\.[Mm]\.|[Mm]))(?!\w))?"
         r"|\b(?P<h2>1[0-2]|0?[1-9])\s*(?P<ap2>[AaPp](?:\.[Mm]\.|[Mm]))(?!\w)", _time_any),
        (rf"(?P<sym>[$€£¥₹])\s?(?P<amt1>{num})(?:\s?(?P<scale>thousand|million|billion|bn|mn|[kKmMbB])\b)?"
         rf"|\b(?P<iso1>USD|EUR|GBP|JPY|CAD|AUD|CHF|CNY|INR|MXN)\s?(?P<amt2>{num})"
         rf"|(?P<amt3>{num})\s?(?P<iso2>USD|EUR|GBP|JPY|CAD|AUD|CHF|CNY|INR|MXN)\b", lambda m, t: _money(m)),
        (rf"(?P<pct>-?{num})\s?%", lambda m, t: _percent(m)),
        (rf"\b(?P<qty>{num})\s?(?P<unit>km/h|°C|°F|°|{'|'.join(u for u in UNITS if u[0] != '°' and u != 'km/h')})"
         r"(?![\w/])", lambda m, t: _unit(m)),
        (r"\b(?P<ord>\d+)(?:st|nd|rd|th)\b", lambda m, t: ordinal(int(m["ord"]))),
        (r"\b(?P<r1>\d{1,4})\s?[-–—]\s?(?P<r2>\d{1,4})\b(?![-/.]\d)", lambda m, t: _range(m)),
        (r"\b\d{1,20}(?:-\d{1,20}){1,8}\b", lambda m, t: _identifier(m)),  # (not a date, range or telephone number)
        # letters and digits mixed ("4471-22B", "XR-500"), not a number and a word ("30-day", "top-10")
        (r"\b(?!\d+-[A-Za-z][a-z]+\b)(?![A-Za-z][a-z]+-\d)(?=[A-Za-z0-9-]{0,63}\d)"
         r"(?=[A-Za-z0-9-]{0,63}[A-Za-z])[A-Za-z0-9]{1,32}(?:-[A-Za-z0-9]{1,32}){0,8}\b", lambda m, t: _identifier(m)),
        (r"#(?=\d)", lambda m, t: "number "),
        (rf"(?<![\w.])-(?=[$€£¥₹]?(?:{NUMBER})\b)", lambda m, t: "minus "),
        (rf"\b(?:{NUMBER})\b", _number),
        (r"\b(?P<abbr>Dr|Mr|Mrs|Ms|Prof|St|Jr|Sr|Mt|Ave|Rd|Blvd|Apt|Dept|No|approx|etc|vs|e\.g|i\.e|Inc|Ltd)\.",
         _abbreviation),
        (r" ?& ?", lambda m, t: " and "),  # ("AT&T": "AT and T")
    ]


def _time_any(m: re.Match, text: str) -> str:
    if m["h2"] is not None:
        said = _time_parts(int(m["h2"]), 0, m["ap2"])
    else:
        said = _time_parts(int(m["h"]), int(m["min"]), m["ap"])
    ends = m.group(0).endswith(".") and re.match(r"\s*(?:$|[A-Z])", text[m.end():])
    return said + "." if ends else said  # ("p.m." ending a sentence ends it still)


def _time_parts(hour: int, minute: int, half: str | None) -> str:
    words = cardinal(hour)
    if minute:
        words += " " + (f"oh {ONES[minute]}" if minute < 10 else cardinal(minute))
    elif not half:
        words += " o'clock" if hour <= 12 else " hundred"
    if half:
        words += " " + " ".join(c for c in half.lower() if c.isalpha())
    return words


class English:
    """The rules compiled into one pattern; ``day_first``: 03/04/2027 is the 3rd of April (en-GB,
    en-AU, ...), not March 4th."""

    def __init__(self, day_first: bool = False):
        self.rules = rules(day_first)
        self.pattern = re.compile("|".join(f"(?P<rule{i}>{p})" for i, (p, _) in enumerate(self.rules)))

    def normalize(self, text: str) -> Rewritten:
        out = Builder(text)
        kept = 0
        for m in self.pattern.finditer(text):
            said = self.rules[int(m.lastgroup[4:])][1](m, text)  # (the rule's group closes last: it is lastgroup)
            if said is None:
                continue
            out.copy(kept, m.start())
            out.emit(said, m.start(), m.end())
            kept = m.end()
        out.copy(kept, len(text))
        return out.result()
