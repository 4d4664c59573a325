"""Pieces both front ends share: incremental text, request options, error mapping, draining."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from lyre.audio import AudioFormatError
from lyre.service import (
    InvalidRequest,
    LyreError,
    OverloadedError,
    ServiceUnavailable,
    SynthesisCancelled,
    SynthesisFailed,
    SynthesisTimeout,
    TextTooLong,
    UnknownVoice,
)

# A clause or sentence is complete once its punctuation is followed by whitespace.
_CLAUSE = re.compile(r"[.!?…,;:—–][\"')\]]*\s+")
_SENTENCE = re.compile(r"[.!?…][\"')\]]*\s+")


class IncrementalText:
    """Text arriving in pieces (an LLM writing). The first complete clause is handed out at once, so
    synthesis starts while the rest is still being written; after that whole sentences (or clauses,
    once ``long_chars`` have piled up), so prosody spans the sentence."""

    def __init__(self, long_chars: int = 200) -> None:
        self._buffer = ""
        self._first = True
        self.long_chars = long_chars

    def append(self, text: str) -> list[str]:
        self._buffer += text
        pattern = _CLAUSE if self._first or len(self._buffer) >= self.long_chars else _SENTENCE
        last = None
        for m in pattern.finditer(self._buffer):
            last = m
        if last is None:
            return []
        ready, self._buffer = self._buffer[: last.end()].strip(), self._buffer[last.end() :]
        if not ready:
            return []
        self._first = False
        return [ready]

    def flush(self) -> list[str]:
        ready, self._buffer = self._buffer.strip(), ""
        if ready:
            self._first = False
        return [ready] if ready else []


SAMPLING_FIELDS = {
    "temperature": (float, 0.0, 5.0),
    "top_p": (float, 1e-9, 1.0),
    "top_k": (int, 0, 1_000_000),
    "repetition_penalty": (float, 1.0, 3.0),
    "max_tokens": (int, 1, 100_000),
    "min_tokens": (int, 0, 100_000),
    "seed": (int, 0, 2**63 - 1),
}


def sampling_options(body: dict[str, Any]) -> dict[str, Any]:
    """Sampling overrides present in a request body, type- and range-checked."""
    out = {}
    for name, (kind, lo, hi) in SAMPLING_FIELDS.items():
        if body.get(name) is None:
            continue
        value = body[name]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is int:
            ok = ok and float(value).is_integer()
        if not ok:
            raise InvalidRequest(f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {value!r}")
        value = kind(value)
        if not lo <= value <= hi:
            raise OutOfRange(f"'{name}' = {value} is out of range [{lo:g}, {hi:g}]")
        out[name] = value
    return out


class OutOfRange(InvalidRequest):
    code = "out_of_range"


@dataclass(frozen=True)
class ErrorInfo:
    http_status: int
    grpc_status: str  # name of a grpc.StatusCode
    type: str


def classify(error: BaseException) -> ErrorInfo:
    """How a Lyre error maps to HTTP and gRPC status codes."""
    if isinstance(error, UnknownVoice):
        return ErrorInfo(404, "NOT_FOUND", "not_found_error")
    if isinstance(error, (TextTooLong, OutOfRange, AudioFormatError)):
        return ErrorInfo(422, "INVALID_ARGUMENT", "invalid_request_error")
    if isinstance(error, InvalidRequest):
        return ErrorInfo(400, "INVALID_ARGUMENT", "invalid_request_error")
    if isinstance(error, OverloadedError):
        return ErrorInfo(429, "RESOURCE_EXHAUSTED", "overloaded_error")
    if isinstance(error, ServiceUnavailable):
        return ErrorInfo(503, "UNAVAILABLE", "service_unavailable")
    if isinstance(error, SynthesisTimeout):
        return ErrorInfo(504, "DEADLINE_EXCEEDED", "timeout_error")
    if isinstance(error, SynthesisCancelled):
        return ErrorInfo(499, "CANCELLED", "cancelled")
    if isinstance(error, (SynthesisFailed, LyreError)):
        return ErrorInfo(500, "INTERNAL", "server_error")
    return ErrorInfo(500, "INTERNAL", "server_error")


def error_code(error: BaseException) -> str:
    if isinstance(error, AudioFormatError):
        return "unsupported_format"
    return getattr(error, "code", "internal_error")


class InFlight:
    """Counts requests being served, so a shutdown can wait for them (no polling)."""

    def __init__(self) -> None:
        self.count = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    def __enter__(self) -> InFlight:
        self.count += 1
        self._idle.clear()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
