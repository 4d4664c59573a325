"""A batch's JSONL input, read and checked whole before anything is stored.

One JSON object per line (blank lines are skipped), in either shape:

- Lyre's: ``{"custom_id": "r1", "input": "Hello Ann", "voice": "tara", "response_format": "mp3", ...}``
  — every field of ``POST /v1/audio/speech`` except ``stream_format`` and ``timestamps``; or
  ``"template": "Hello {name}"`` with ``"variables": {"name": "Ann"}`` in place of ``input``;
- OpenAI's Batch line: ``{"custom_id": "r1", "method": "POST", "url": "/v1/audio/speech", "body": {...}}``.

The documented choice for bad input: **the batch is refused at validation**, listing every bad line
(up to :data:`MAX_PROBLEMS`) with its number — a malformed line, a missing or repeated
``custom_id``, an unknown voice, lexicon or template variable, a text over the limit, an option out of
range. Nothing is stored, so a corrected input can be sent again with the same Idempotency-Key.
What can only fail later (a voice deleted meanwhile, the engine) fails that item alone, in the
error file.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any
from xml.sax.saxutils import escape

from pydantic import AfterValidator, Field, StrictFloat, StrictInt, StrictStr

from lyre.audio.formats import check_bitrate, check_format, check_speed
from lyre.errors import InvalidBatch, InvalidRequest, LyreError
from lyre.service.options import SpeechBody, parse

MAX_PROBLEMS = 100  # bad lines listed in one refusal (the count says how many there were)
OPENAI_URL = "/v1/audio/speech"
MAX_TEMPLATE_OUTPUT = 100_000  # characters a filled template may reach before the text limit is even checked
# a custom_id names its audio in a URL path and a file name: printable, no braces, not "." or ".."
_BAD_ID = re.compile(r"[\x00-\x1f\x7f{}\ud800-\udfff]")


def _custom_id(value: str) -> str:
    if _BAD_ID.search(value) or value in (".", ".."):
        raise ValueError("must be printable text without braces, and not '.' or '..'")
    return value


CustomId = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_custom_id)]


class BatchLine(SpeechBody):
    """One line of a batch's input (Lyre's shape)."""

    custom_id: CustomId = Field(description="the caller's id of this item, unique in the batch")
    template: str | None = Field(None, max_length=100_000, description="text with {name} fields, filled from 'variables'")
    variables: dict[str, StrictStr | StrictInt | StrictFloat] | None = Field(None, max_length=1000)


@dataclass(frozen=True)
class Item:
    line: int
    custom_id: str
    request: dict[str, Any]  # text, voice, response_format, speed, sample_rate, bitrate, options


def read(data: bytes, max_items: int, check: Callable[[dict[str, Any], str | None], None]) -> list[Item]:
    """Every line of ``data`` as an :class:`Item`, or InvalidBatch naming each bad line. ``check(request,
    voice)`` raises what would make the item fail at once (an unknown voice, a text over the limit)."""
    try:
        text = data.decode("utf-8-sig")  # (a byte-order mark is allowed)
    except UnicodeDecodeError as e:
        raise InvalidBatch(f"the input is not UTF-8 (byte {e.start}): send JSONL, one JSON object per line") from None
    items: list[Item] = []
    problems: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.split("\n"), start=1):  # (JSON strings may hold U+2028 and the like)
        raw = raw.removesuffix("\r")
        if not raw.strip():
            continue
        if len(items) + len(problems) >= max_items:
            raise InvalidBatch(f"the input has more than {max_items} items (batch.max_items_per_batch)")
        try:
            item = _item(number, raw)
            if item.custom_id in seen:
                raise InvalidRequest(f"custom_id {item.custom_id!r} is already used on line {seen[item.custom_id]}")
            check(item.request, item.request.get("voice"))
        except (LyreError, ValueError) as e:
            problems.append((number, str(e)))
            continue
        seen[item.custom_id] = number
        items.append(item)
    if problems:
        shown = "; ".join(f"line {n}: {why}" for n, why in problems[:5])
        more = f" (and {len(problems) - 5} more lines)" if len(problems) > 5 else ""
        raise InvalidBatch(f"{len(problems)} of the input's lines cannot be run, nothing was stored: {shown}{more}",
                           problems[:MAX_PROBLEMS])
    if not items:
        raise InvalidBatch("the input has no items: send JSONL, one JSON object per line")
    return items


def _item(number: int, raw: str) -> Item:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise InvalidRequest(f"not a JSON object ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(data, dict):
        raise InvalidRequest("not a JSON object")
    if "body" in data or "method" in data or "url" in data:  # OpenAI's Batch line
        if data.get("method", "POST") != "POST" or data.get("url", OPENAI_URL) != OPENAI_URL:
            raise InvalidRequest(f"only POST {OPENAI_URL} can be batched here")
        body = data.get("body")
        if not isinstance(body, dict):
            raise InvalidRequest("'body' must be a JSON object (the /v1/audio/speech request)")
        extra = set(data) - {"custom_id", "method", "url", "body"}
        if extra:
            raise InvalidRequest(f"unknown field {sorted(extra)[0]!r} beside 'body'")
        data = {**body, "custom_id": data.get("custom_id")}
    line = parse(BatchLine, data)
    if line.stream_format is not None or line.timestamps is not None:
        raise InvalidRequest("'stream_format' and 'timestamps' are for live responses; a batch item is a file")
    text = _text(line)
    fmt = line.response_format or ("mp3" if line.input is not None else "wav")  # (as /v1/audio/speech)
    check_bitrate(fmt, check_format(fmt, line.sample_rate), line.bitrate)
    check_speed(line.speed or 1.0)
    request = {"text": text, "voice": line.voice, "response_format": fmt, "speed": line.speed or 1.0,
               "sample_rate": line.sample_rate, "bitrate": line.bitrate, "options": line.options()}
    return Item(number, line.custom_id, request)


def _text(line: BatchLine) -> str:
    given = [name for name in ("input", "text", "template") if getattr(line, name) is not None]
    if len(given) != 1:
        raise InvalidRequest("give one of 'input', 'text' or 'template' (with 'variables')")
    if line.template is None:
        if line.variables is not None:
            raise InvalidRequest("'variables' fill a 'template'; this item has none")
        return line.input if line.input is not None else line.text
    return fill(line.template, line.variables or {}, ssml=line.template.lstrip().startswith(("<speak", "<?xml")))


def fill(template: str, variables: dict[str, Any], ssml: bool = False) -> str:
    """``template``'s ``{name}`` fields from ``variables`` (``{{`` and ``}}`` are braces). Only plain names:
    no attributes, indexes, conversions or formats (nothing a template can reach through); the result
    is bounded as it is built. In an SSML template the values are text: "&" and "<" are escaped."""
    out, used, size = [], set(), 0
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise InvalidRequest(f"the template cannot be read: {e}") from None
    for literal, name, spec, conversion in parts:
        out.append(literal)
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise InvalidRequest(f"template field {{{name}}} is not a plain name (write {{name}}; {{{{ for a brace)")
        if name not in variables:
            raise InvalidRequest(f"template variable {name!r} is not in 'variables'")
        used.add(name)
        value = str(variables[name])
        out.append(escape(value) if ssml else value)
        size += len(literal) + len(out[-1])
        if size > MAX_TEMPLATE_OUTPUT:
            raise InvalidRequest(f"the filled template passes {MAX_TEMPLATE_OUTPUT} characters")
    unused = sorted(set(variables) - used)
    if unused:
        raise InvalidRequest(f"variable {unused[0]!r} is not used by the template")
    return "".join(out)
