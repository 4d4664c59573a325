"""Every option a request may carry, and its limits: defined once, here.

The library API (``TTSService.stream``), REST, WebSocket and gRPC all validate through these
pydantic models; a request's sampling options take their limits from the config's ``sampling``
section (:class:`lyre.config.SamplingConfig`), where they are declared once. Wrong types (``1.5`` for an integer, ``true`` for a number, ``"1"`` for a
number), NaN and Infinity, out-of-range values, lone surrogates in text and unknown options are
refused with :class:`~lyre.errors.InvalidRequest` (or ``OutOfRange``), whose message is the same
on every surface, before anything reaches the engine thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from lyre.config import SamplingConfig
from lyre.config.validation import limits_of, request_error

MAX_NAME_CHARS = 128  # voices, formats, context ids, model names
# how the voice speaks (the model family decides what it honours), and how the text is read
VOICE_OPTIONS = ("language", "instructions", "text_normalization", "ssml", "lexicons")


def _valid_unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode text (it contains a lone surrogate)") from None
    return value


Text = Annotated[str, AfterValidator(_valid_unicode)]
Name = Annotated[str, StringConstraints(max_length=MAX_NAME_CHARS), AfterValidator(_valid_unicode)]
LexiconIds = Annotated[list[Name], Field(max_length=16)]  # a request's lexicons (LEXICONS_HELP)


def _not_null(value: Any) -> Any:
    if value is None:
        raise ValueError("must be a string, not null (leave it out instead)")
    return value


# Text to speak that may be left out but, when given, is a string with something besides
# whitespace (an explicit null, "" or "  " is refused), as the OpenAPI document says; the default
# None is not validated, so leaving it out still works.
GivenText = Annotated[Text | None, BeforeValidator(_not_null), WithJsonSchema({"type": "string", "pattern": r"\S"}),
                      Field(json_schema_extra=lambda schema: schema.pop("default", None))]  # (null is no string)


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


def _limit(name: str) -> dict[str, Any]:
    return limits_of(SamplingConfig, name)


class SamplingOptions(_Options):
    """Per-request sampling overrides; None (absent) takes ``sampling`` from the config."""

    temperature: float | None = Field(None, **_limit("temperature"), description="sampling temperature; 0 = greedy")
    top_p: float | None = Field(None, **_limit("top_p"), description="nucleus sampling mass")
    top_k: int | None = Field(None, **_limit("top_k"), description="top-k sampling; 0 = off")
    repetition_penalty: float | None = Field(None, **_limit("repetition_penalty"), description="1 = off")
    max_tokens: int | None = Field(None, **_limit("max_tokens"), description="audio tokens at most (Orpheus: about 83 a "
                                   "second; Qwen3-TTS: 80 ms frames, within its text's cap)")
    min_tokens: int | None = Field(None, **_limit("min_tokens"), description="end-of-speech is held back until this many")
    seed: int | None = Field(None, **_limit("seed"), description="makes the sampling reproducible")

    @model_validator(mode="after")
    def _min_within_max(self) -> SamplingOptions:
        if self.min_tokens is not None and self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"'min_tokens' = {self.min_tokens} is more than 'max_tokens' = {self.max_tokens}")
        return self

    def sampling(self) -> dict[str, Any]:
        """The sampling overrides given (for ``TTSService.stream(..., **overrides)``)."""
        return {name: getattr(self, name) for name in SamplingOptions.model_fields if getattr(self, name) is not None}

    def options(self) -> dict[str, Any]:
        """:meth:`sampling`, and how the voice speaks (``language``, ``instructions``) where given."""
        voice = {n: getattr(self, n) for n in VOICE_OPTIONS if getattr(self, n, None) is not None}
        return {**self.sampling(), **voice}


class SynthesisRequest(SamplingOptions):
    """``TTSService.stream(text, voice, **sampling)``."""

    text: Text
    voice: Name | None = None
    language: Name | None = None  # the language spoken (a Qwen3-TTS checkpoint's names; default auto)
    instructions: Text | None = None  # a voice description (Qwen3-TTS VoiceDesign and 1.7B CustomVoice)
    text_normalization: TextNormalization | None = None  # NORMALIZATION_HELP
    ssml: SsmlMode | None = None  # SSML_HELP
    lexicons: LexiconIds | None = None  # LEXICONS_HELP


def _voice_ref(value: Any) -> Any:
    """OpenAI's form of a custom voice, ``{"id": "v_..."}``, is that id."""
    if isinstance(value, dict):
        if set(value) != {"id"} or not isinstance(value["id"], str):
            raise ValueError('must be a voice name or {"id": "<voice id>"}')
        return value["id"]
    return value


_NAME_SCHEMA = {"type": "string", "maxLength": MAX_NAME_CHARS}
# a voice's name, or OpenAI's {"id": ...} form of one (a cloned voice's id)
VoiceName = Annotated[Name | None, BeforeValidator(_voice_ref), WithJsonSchema({"anyOf": [
    _NAME_SCHEMA, {"type": "object", "properties": {"id": _NAME_SCHEMA}, "required": ["id"],
                   "additionalProperties": False}, {"type": "null"}]})]


# what timestamps a stream sends (lyre.service.timing.Piece.as_dict): each piece's span; and its estimated
# words (Cartesia's word_timestamps); and its characters' estimated times (ElevenLabs' alignment)
Timestamps = Literal["pieces", "words", "chars"]
# whether numbers, money, dates, ... are said as words first (ElevenLabs' names): auto and on do
# where Lyre has rules for the language (English), on refuses a language it has none for; off reads
# the text as written
TextNormalization = Literal["auto", "on", "off"]
# whether text that starts with <speak> is read as SSML (lyre.text.ssml): auto, strictly (an unknown
# tag is refused), lenient (an unknown tag is read as its text), or off (the markup is read as text)
SsmlMode = Literal["auto", "lenient", "off"]
LEXICONS_HELP = ("ids of the account's pronunciation lexicons (POST /v1/lexicons) to read, in order (the first that "
                 "names a word wins); default: the account's default lexicons; [] for none")
SSML_HELP = ("auto (default): text that starts with <speak> is SSML, and a tag Lyre does not read is refused (400); "
             "lenient: such a tag is read as its text; off: the text is read as written, markup and all")
NORMALIZATION_HELP = ("auto (default) or on: numbers, money, dates, times, telephone numbers, web addresses, units, "
                      "abbreviations and identifiers are said as words (English; on refuses another language); off: "
                      "the text is read as written")


class SpeechBody(SamplingOptions):
    """The JSON body of ``POST /v1/audio/speech`` (OpenAI's fields, then Lyre's)."""

    model_config = ConfigDict(**_Options.model_config,
                              json_schema_extra={"oneOf": [{"required": ["input"]}, {"required": ["text"]}]})

    model: Name | None = Field(None, description="accepted and ignored (one model is served)")
    input: GivenText = Field(None, description="what to say (OpenAI's name); up to server.max_input_chars, "
                               "split into sentences and spoken as one stream")
    text: GivenText = Field(None, description="seed 004's name for 'input' (give one of the two)")
    voice: VoiceName = Field(None, description="a voice of GET /v1/voices or one of its aliases, any case, or "
                             "OpenAI's {\"id\": ...} form of a cloned voice; default model.default_voice")
    response_format: Name | None = Field(None, description="default mp3 with 'input', wav with 'text'; FLAC is "
                                         "sent whole (its header holds the length), the others stream",
                                         json_schema_extra={"enum": ["mp3", "opus", "aac", "flac", "wav", "pcm",
                                                                     "mulaw", "alaw", None]})
    speed: float | None = Field(None, ge=0.25, le=4.0, description="tempo without a change of pitch")
    stream_format: Literal["audio", "sse"] | None = Field(None, description="audio (default) or sse: "
                                                          "speech.audio.delta events, then speech.audio.done")
    instructions: Text | None = Field(None, description="a voice description: Qwen3-TTS VoiceDesign and 1.7B "
                                      "CustomVoice read it, other Qwen3-TTS models refuse it (400); Orpheus takes "
                                      "no style prompt and ignores it")
    language: Name | None = Field(None, description="the language spoken: auto (default) or a language the model "
                                  "names (Qwen3-TTS: english, chinese, ...); Orpheus speaks English")
    text_normalization: TextNormalization | None = Field(None, description=NORMALIZATION_HELP)
    ssml: SsmlMode | None = Field(None, description=SSML_HELP)
    lexicons: LexiconIds | None = Field(None, description=LEXICONS_HELP)
    timestamps: Timestamps | None = Field(None, description="with stream_format sse: a speech.audio.timestamps "
                                          "event after each text piece's audio: pieces (its span), words (and its "
                                          "estimated words), chars (and its characters' estimated times)")
    bitrate: int | None = Field(None, description="bits/s of mp3 (default 64000; 8000-320000, at most 160000 below "
                                "32 kHz and 64000 below 16 kHz), aac (64000; 16000-320000) and opus (48000; "
                                "6000-256000); no other format takes one")
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
    language: Name | None = None  # as SpeechBody's
    instructions: Text | None = None  # as SpeechBody's
    text_normalization: TextNormalization | None = None  # as SpeechBody's
    ssml: SsmlMode | None = None  # as SpeechBody's
    lexicons: LexiconIds | None = None  # as SpeechBody's
    response_format: Name | None = None
    format: Name | None = None  # seed 004's name for response_format
    sample_rate: int | None = None
    bitrate: int | None = None  # of mp3, aac, opus (as SpeechBody's)
    timestamps: Timestamps | None = None  # a {"type": "timestamps"} message after each text piece's audio
    played_s: float | None = Field(None, ge=0.0, le=86400.0)  # with cancel: how much of the audio the client played


class TokenRequest(_Options):
    """The JSON body of ``POST /v1/auth/tokens`` (every field optional)."""

    expires_in_s: float = Field(60.0, ge=1.0, le=600.0, description="how long the token can start a request or "
                                "connection (a WebSocket it opened stays open after)")
    voices: list[Name] | None = Field(None, min_length=1, max_length=64, description="the only voices it may speak (built-in "
                                      "names or aliases, the account's cloned voices' ids); default: all")
    max_session_s: float | None = Field(None, ge=1.0, le=86400.0, description="how long a WebSocket it opens may "
                                        "stay open; default: no limit")


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


class ConsentRename(_Options):
    """The JSON body of ``POST /v1/audio/voice_consents/{consent_id}`` (OpenAI's ``voice_consents.update``)."""

    name: str = Field(min_length=1, max_length=64, description="the consent recording's new label: 1-64 printable "
                      "characters")


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], data: Mapping[str, Any]) -> M:
    """``data`` as a ``model``; raises InvalidRequest / OutOfRange naming the first bad option."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise request_error(model, e.errors(include_url=False)[0]) from None


class LexiconCreate(_Options):
    """The JSON body of ``POST /v1/lexicons``."""

    name: str = Field(min_length=1, max_length=64, description="a label: 1-64 printable characters")
    pls: str = Field(min_length=1, description="the lexicon: a W3C PLS 1.0 document (<lexicon version=\"1.0\" "
                     "xml:lang=...>), at most voices.max_lexicon_bytes")
    default: bool = Field(False, description="read by every request of the account that names no lexicons")
