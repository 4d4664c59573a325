"""Every option a request may carry, and its limits: defined once, here.

The library API (``TTSService.stream``), REST, WebSocket and gRPC all validate through these
pydantic models, and ``config.py`` takes the limits of its ``sampling`` defaults from
:class:`SamplingOptions`. Wrong types (``1.5`` for an integer, ``true`` for a number, ``"1"`` for a
number), NaN and Infinity, out-of-range values, lone surrogates in text and unknown options are
refused with :class:`~lyre.errors.InvalidRequest` (or ``OutOfRange``), whose message is the same
on every surface, before anything reaches the engine thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

import annotated_types
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from lyre.errors import InvalidRequest, OutOfRange, shorten

MAX_NAME_CHARS = 128  # voices, formats, context ids, model names


def _valid_unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode text (it contains a lone surrogate)") from None
    return value


Text = Annotated[str, AfterValidator(_valid_unicode)]
Name = Annotated[str, StringConstraints(max_length=MAX_NAME_CHARS), AfterValidator(_valid_unicode)]


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class SamplingOptions(_Options):
    """Per-request sampling overrides; None (absent) takes ``sampling`` from the config."""

    temperature: float | None = Field(None, ge=0.0, le=5.0, description="sampling temperature; 0 = greedy")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="nucleus sampling mass")
    top_k: int | None = Field(None, ge=0, le=1_000_000, description="top-k sampling; 0 = off")
    repetition_penalty: float | None = Field(None, ge=1.0, le=3.0, description="1 = off")
    max_tokens: int | None = Field(None, ge=1, le=100_000, description="audio tokens at most (about 83 a second)")
    min_tokens: int | None = Field(None, ge=0, le=100_000, description="end-of-speech is held back until this many")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="makes the sampling reproducible")

    def sampling(self) -> dict[str, Any]:
        """The sampling overrides given (for ``TTSService.stream(..., **overrides)``)."""
        return {name: getattr(self, name) for name in SamplingOptions.model_fields if getattr(self, name) is not None}


class SynthesisRequest(SamplingOptions):
    """``TTSService.stream(text, voice, **sampling)``."""

    text: Text
    voice: Name | None = None


class SpeechBody(SamplingOptions):
    """The JSON body of ``POST /v1/audio/speech`` (OpenAI's fields, then Lyre's)."""

    model_config = ConfigDict(**_Options.model_config,
                              json_schema_extra={"oneOf": [{"required": ["input"]}, {"required": ["text"]}]})

    model: Name | None = Field(None, description="accepted and ignored (one model is served)")
    input: Text | None = Field(None, description="what to say (OpenAI's name); up to server.max_input_chars, "
                               "split into sentences and spoken as one stream")
    text: Text | None = Field(None, description="seed 004's name for 'input' (give one of the two)")
    voice: Name | None = Field(None, description="a voice of GET /v1/voices or one of its aliases, any case; "
                               "default model.default_voice")
    response_format: Name | None = Field(None, description="default mp3 with 'input', wav with 'text'; FLAC is "
                                         "sent whole (its header holds the length), the others stream",
                                         json_schema_extra={"enum": ["mp3", "opus", "aac", "flac", "wav", "pcm",
                                                                     "mulaw", "alaw", None]})
    speed: float | None = Field(None, ge=0.25, le=4.0, description="tempo without a change of pitch")
    stream_format: Literal["audio", "sse"] | None = Field(None, description="audio (default) or sse: "
                                                          "speech.audio.delta events, then speech.audio.done")
    instructions: Text | None = Field(None, description="accepted and ignored: Orpheus takes no style prompt")
    sample_rate: int | None = Field(None, description="8000-48000 (mp3 and aac: 8000, 11025, 12000, 16000, 22050, "
                                   "24000, 32000, 44100, 48000; opus: 8000, 12000, 16000, 24000, 48000); default "
                                   "24000, 8000 for mulaw and alaw")


class WsMessage(SamplingOptions):
    """One JSON message on the WebSocket (``GET /v1/audio/stream``)."""

    context_id: Name | None = None
    text: Text | None = None
    input: Text | None = None  # OpenAI's name for ``text`` (one of the two, not both)
    append: str | None = None  # checked by the Utterance, which joins a character split between appends
    flush: bool | None = None
    end: bool | None = None
    cancel: bool | None = None
    voice: Name | None = None
    response_format: Name | None = None
    format: Name | None = None  # seed 004's name for response_format
    sample_rate: int | None = None


class Consent(_Options):
    """The consent record an enrollment must carry (seeds 000 and 001): who is speaking, that they
    agreed, and how the recording was made."""

    granted: bool = Field(description="must be true: the speaker agreed to this voice being cloned")
    speaker: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=256),
                       AfterValidator(_valid_unicode)] = Field(description="who is speaking in the clip")
    source: Literal["self_recorded", "recorded_with_permission"] = Field(
        description="self_recorded (the speaker is the one enrolling) or recorded_with_permission")
    statement: Annotated[str, StringConstraints(max_length=2000), AfterValidator(_valid_unicode)] | None = Field(
        None, description="free text, e.g. how and when consent was given")


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], data: Mapping[str, Any]) -> M:
    """``data`` as a ``model``; raises InvalidRequest / OutOfRange naming the first bad option."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _request_error(model, e) from None


_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "string_type": "a string", "bool_type": "true or false", "bool_parsing": "true or false",
}


def _request_error(model: type[BaseModel], e: ValidationError) -> InvalidRequest:
    err = e.errors(include_url=False)[0]
    name = ".".join(str(part) for part in err["loc"]) or "request"
    kind, got = err["type"], shorten(err.get("input"))
    if kind == "extra_forbidden":
        return InvalidRequest(f"unknown option '{name}'; allowed: {', '.join(model.model_fields)}")
    if kind == "missing":
        return InvalidRequest(f"'{name}' is required")
    if kind in _RANGE_ERRORS:
        return OutOfRange(f"'{name}' = {got} is out of range: {describe_range(limits_of(model, name))}")
    if kind in _EXPECTED:
        return InvalidRequest(f"'{name}' must be {_EXPECTED[kind]}, got {got}")
    if kind == "string_too_long":
        return InvalidRequest(f"'{name}' is longer than {err['ctx']['max_length']} characters")
    if kind == "literal_error":
        return OutOfRange(f"'{name}' must be {err['ctx']['expected']}, got {got}")
    if kind == "value_error":
        return InvalidRequest(f"'{name}' {err['ctx']['error']}")
    return InvalidRequest(f"'{name}': {err['msg']}, got {got}")


# --------------------------------------------------------------------------------------------
# limits, for config.py and error messages


_LIMIT_NAMES = {annotated_types.Ge: "ge", annotated_types.Gt: "gt", annotated_types.Le: "le", annotated_types.Lt: "lt"}


def limits_of(model: type[BaseModel], name: str) -> dict[str, Any]:
    """``{"ge": 0.0, "le": 5.0}`` for a field of ``model`` (the form config.py's fields carry)."""
    out = {}
    for item in model.model_fields[name].metadata:
        key = _LIMIT_NAMES.get(type(item))
        if key is not None:
            out[key] = getattr(item, key)
    return out


def describe_range(limits: Mapping[str, Any]) -> str:
    parts = [f"{sym} {limits[name]}" for name, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
             if name in limits]
    if "multiple_of" in limits:
        parts.append(f"a multiple of {limits['multiple_of']}")
    return "must be " + " and ".join(parts)
