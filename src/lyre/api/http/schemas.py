"""The bodies of the REST surface's answers, as pydantic models: the OpenAPI document's response
schemas (:mod:`lyre.api.http.openapi`); the request bodies are :mod:`lyre.service.options`'."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lyre.service.options import ConsentRename, LexiconCreate, SpeechBody, TokenRequest, WsMessage


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BadLine(_Shape):
    line: int = Field(description="its number in the input (1-based)")
    message: str


class ErrorDetail(_Shape):
    message: str = Field(description="what went wrong, in words")
    type: str = Field(description="invalid_request_error, authentication_error, not_found_error, "
                      "overloaded_error, service_unavailable, timeout_error or server_error")
    code: str = Field(description="a stable code, e.g. unknown_voice, unsupported_format, too_many_connections")
    lines: list[BadLine] | None = Field(None, description="a batch input refused at validation: every bad line")


class Error(_Shape):
    """Every error answer (OpenAI's form)."""

    error: ErrorDetail


class Voice(_Shape):
    """A built-in voice, or one of the caller's cloned voices."""

    id: str = Field(description="what a request passes as 'voice' (a built-in voice's id is its name)")
    name: str
    type: Literal["builtin", "cloned"]
    aliases: list[str] | None = Field(None, description="built-in: other names for it (OpenAI's by default)")
    created_at: str | None = Field(None, description="cloned: when it was enrolled (RFC 3339)")
    transcript: str | None = Field(None, description="cloned: the words of the reference clip")
    duration_s: float | None = Field(None, description="cloned: the reference clip's length")
    reference_tokens: int | None = Field(None, description="cloned: Orpheus audio tokens of the reference clip")
    audio_sha256: str | None = Field(None, description="cloned: sha256 of the stored (normalised FLAC) clip")
    codec_id: str | None = Field(None, description="cloned: the SNAC weights its tokens were made with")
    model_id: str | None = Field(None, description="cloned: the checkpoint served when it was enrolled")


class VoiceList(_Shape):
    voices: list[Voice]
    default: str = Field(description="the voice used when a request names none")


class ConsentRecord(_Shape):
    granted: bool
    speaker: str
    source: Literal["self_recorded", "recorded_with_permission"]
    statement: str | None
    time: str = Field(description="when the voice was enrolled (RFC 3339, UTC)")
    account: str = Field(description="the account that enrolled it")
    address: str | None = Field(description="the client address it was enrolled from")
    upload_sha256: str = Field(description="sha256 of the audio file as uploaded")
    consent_id: str | None = Field(None, description="the consent recording (POST /v1/audio/voice_consents) the "
                                   "voice was created with")


class Consent(_Shape):
    id: str
    consent: ConsentRecord


class Verification(_Shape):
    """``POST /v1/audio/verify`` (or the raw file as the body)."""

    audio: bytes = Field(description="the audio file to check: any format FFmpeg reads (wav, flac, mp3, ogg, ...)")


class VerifyResult(_Shape):
    watermarked: bool = Field(description="score >= threshold")
    score: float = Field(description="correlation with Lyre's mark at the best lag, in standard deviations "
                         "(unmarked audio: ~4-5)")
    threshold: float = Field(description="watermark.threshold")
    seconds: float = Field(description="the audio's duration (the first 600 s are checked)")


class Enrollment(_Shape):
    """``POST /v1/voices`` (multipart/form-data)."""

    audio: bytes = Field(description="the reference recording: wav, flac, mp3, ogg/opus, ...; any sample rate, "
                         "mono or stereo; 3-30 s (voices.min_seconds, max_seconds); at most voices.max_upload_bytes")
    transcript: str = Field(description="the exact words spoken in the recording")
    name: str = Field(description="1-64 printable characters, unique within the account")
    consent: str = Field(description='JSON: {"granted": true, "speaker": "who is speaking", "source": '
                         '"self_recorded" | "recorded_with_permission", "statement": "optional"}')


class AudioVoice(_Shape):
    """OpenAI's custom voice (``audio.voice``): one of the caller's cloned voices."""

    id: str = Field(description="the voice's id: what a request passes as voice (or {\"id\": ...})")
    object: Literal["audio.voice"]
    created_at: int = Field(description="UNIX seconds")
    name: str
    type: Literal["audio_sample"] = Field(description="cloned from a recording (Lyre makes no 'prompt' voices)")


class AudioVoiceList(_Shape):
    """A cursor page, newest first (Lyre's: OpenAI's API lists no voices)."""

    object: Literal["list"]
    data: list[AudioVoice]
    first_id: str | None
    last_id: str | None = Field(description="pass it as 'after' for the next page")
    has_more: bool


class AudioVoiceDeleted(_Shape):
    id: str
    deleted: bool
    object: Literal["audio.voice.deleted"]


class AudioVoiceUpload(_Shape):
    """``POST /v1/audio/voices`` (multipart/form-data): OpenAI's fields and Lyre's transcript."""

    audio_sample: bytes = Field(description="the recording to clone, as for POST /v1/voices' audio: 3-30 s, at "
                                "most voices.max_upload_bytes")
    consent: str = Field(description="the id of the speaker's consent recording (cons_...)")
    name: str = Field(description="1-64 printable characters, unique within the account")
    transcript: str = Field(description="Lyre's: the exact words spoken in audio_sample (OpenAI's API takes none)")
    type: Literal["audio_sample"] | None = Field(None, description="audio_sample (OpenAI's 'prompt' is refused)")


class Lexicon(_Shape):
    """A pronunciation lexicon of the caller's (``pls``: only from GET /v1/lexicons/{id})."""

    id: str = Field(description="lex_ + 16 characters: what a request passes in 'lexicons'")
    name: str
    language: str = Field(description="its xml:lang")
    created_at: int = Field(description="UNIX seconds")
    sha256: str = Field(description="of the PLS document as sent")
    aliases: int = Field(description="lexemes with an alias: read in place of their graphemes")
    unused_phonemes: int = Field(description="lexemes with phonemes only: kept, but no model family served reads "
                                 "phonemes")
    default: bool = Field(description="read by every request of the account that names no lexicons")
    pls: str | None = Field(None, description="the PLS document")


class LexiconList(_Shape):
    lexicons: list[Lexicon]


class BatchCounts(_Shape):
    total: int
    completed: int
    failed: int
    queued: int
    running: int
    cancelled: int
    expired: int


class Batch(_Shape):
    """A batch job (OpenAI's Batch object, with Lyre's counts and file addresses; times in UNIX seconds)."""

    id: str
    object: Literal["batch"]
    endpoint: str
    status: Literal["in_progress", "cancelling", "completed", "cancelled", "expired"]
    completion_window: str
    created_at: int
    in_progress_at: int
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    expired_at: int | None
    failed_at: None = Field(description="always null: a batch that fails validation is refused, never stored")
    request_counts: BatchCounts
    output_url: str = Field(description="GET: JSONL, a line per completed item")
    error_url: str = Field(description="GET: JSONL, a line per failed, cancelled or expired item")
    input_bytes: int
    metadata: dict[str, str]


class BatchList(_Shape):
    object: Literal["list"]
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VoiceConsent(_Shape):
    """OpenAI's voice consent (``audio.voice_consent``): a recording of the speaker's consent."""

    id: str
    object: Literal["audio.voice_consent"]
    created_at: int = Field(description="UNIX seconds")
    name: str = Field(description="its label")
    language: str = Field(description="BCP 47 tag of the consent phrase's language")


class VoiceConsentList(_Shape):
    """A cursor page, newest first."""

    object: Literal["list"]
    data: list[VoiceConsent]
    first_id: str | None
    last_id: str | None = Field(description="pass it as 'after' for the next page")
    has_more: bool


class VoiceConsentDeleted(_Shape):
    id: str
    deleted: bool
    object: Literal["audio.voice_consent"] = Field(description="as OpenAI's SDK reads it")


class VoiceConsentUpload(_Shape):
    """``POST /v1/audio/voice_consents`` (multipart/form-data)."""

    recording: bytes = Field(description="the speaker saying they consent: any file FFmpeg reads, 3-30 s, at most "
                             "voices.max_upload_bytes")
    name: str = Field(description="a label: 1-64 printable characters")
    language: str = Field(description="BCP 47 tag of the consent phrase's language, e.g. en-US")


class Model(_Shape):
    id: str
    object: str = Field(json_schema_extra={"const": "model"})
    created: int
    owned_by: str


class ModelList(_Shape):
    """OpenAI's form; any model name is accepted in requests."""

    object: str = Field(json_schema_extra={"const": "list"})
    data: list[Model]


class SchedulerStats(BaseModel):
    total_sessions: int
    active_sessions: int
    pending_sessions: int
    max_concurrent: int


class KvCacheStats(BaseModel):
    used_slots: int
    free_slots: int


class Stats(BaseModel):
    """Seed 004's snapshot; ``engine`` and ``codec`` hold backend-specific figures."""

    scheduler: SchedulerStats
    kv_cache: KvCacheStats
    total_tokens: int
    total_batches: int
    engine: dict[str, Any] = Field(description="the backend ('torch' or 'trtllm') and its statistics")
    codec: dict[str, Any] = Field(description="the codec's mode, runtime and counters")
    cpu_seconds: dict[str, float] | None = Field(
        None, description="operator view: this process's CPU seconds so far by part (model, sampling, codec, "
                          "encoding) and in all (process)")


class Ready(_Shape):
    ready: bool
    reason: Literal["draining", "full", "unavailable", "audit_unavailable"] | None = Field(
        description="why not (None when ready)")
    active_sessions: int
    pending_sessions: int
    capacity: int = Field(description="KV slots (scheduler.max_concurrent_sessions)")
    capacity_utilisation: float = Field(description="(active + pending) / capacity: 1 = every slot busy")


class TokenGrant(_Shape):
    """``POST /v1/auth/tokens``: a short-lived client token."""

    token: str = Field(description="pass it as 'Authorization: Bearer <token>', or on the WebSocket as ?token= or "
                       "the subprotocol 'lyre-token.<token>'")
    expires_at: int = Field(description="UNIX seconds after which it starts no request or connection")
    expires_in_s: float
    account: str = Field(description="the account it acts for (the API key's)")
    voices: list[str] | None = Field(description="the only voices it may speak; null: all the account's")
    max_session_s: float | None = Field(description="how long a WebSocket it opens may stay open; null: no limit")


class Health(_Shape):
    status: str = Field(description="ok, draining or unavailable")
    model: str | None = Field(description="where the checkpoint was loaded from")
    demo: bool = Field(description="true on the demo checkpoint (random weights: its audio is noise)")


SCHEMAS: tuple[type[BaseModel], ...] = (Error, VoiceList, Voice, Consent, Enrollment, Verification, VerifyResult,
                                         ModelList, Stats, Health, Ready, SpeechBody, WsMessage, TokenRequest,
                                         TokenGrant, AudioVoice, AudioVoiceList, AudioVoiceDeleted,
                                         AudioVoiceUpload, VoiceConsent, VoiceConsentList, VoiceConsentDeleted,
                                         VoiceConsentUpload, ConsentRename, Lexicon, LexiconList, LexiconCreate,
                                         Batch, BatchList)
