"""The errors a request can end with. Front ends map them to status codes (``lyre.api.common.classify``).

``InvalidRequest`` is also a ``ValueError``: the engine contract's ``add`` raises ValueError for a
request that can never run, and the service's own validation raises the same family.
"""

from __future__ import annotations


class LyreError(Exception):
    code = "internal_error"


class InvalidRequest(LyreError, ValueError):
    code = "invalid_request"


class ControlTokenInText(InvalidRequest):
    """Text that the tokenizer would read as one of the model's control tokens (``<|eot_id|>``, ...)."""

    code = "control_token"


class OutOfRange(InvalidRequest):
    code = "out_of_range"


class UnsupportedMediaType(InvalidRequest):
    """A body whose Content-Type is not the one the route reads (415)."""

    code = "unsupported_media_type"


class UnknownVoice(InvalidRequest):
    code = "unknown_voice"


class UnknownConsent(InvalidRequest):
    """A consent recording id that is not one of the account's (404, worded as for one never made)."""

    code = "unknown_consent"


class UnknownLexicon(UnknownConsent):
    """A lexicon id that is not one of the account's (404, worded as for one never made)."""

    code = "unknown_lexicon"


class UnknownBatch(UnknownConsent):
    """A batch id (or an item's custom_id in it) that is not one of the account's (404, worded as for one never made)."""

    code = "unknown_batch"


class InvalidBatch(InvalidRequest):
    """A batch input refused at validation (400): ``problems`` lists ``(line, message)`` for every bad line."""

    code = "invalid_batch"

    def __init__(self, message: str, problems: list[tuple[int, str]] | None = None):
        super().__init__(message)
        self.problems = problems or []


class TextTooLong(InvalidRequest):
    code = "text_too_long"


class NotPermitted(LyreError):
    """The caller is known, but what it asks is beyond what it may do (a token's scope)."""

    code = "not_permitted"


class OverloadedError(LyreError):
    code = "overloaded"

    def __init__(self, retry_after_s: float, why: str | None = None):
        super().__init__(f"the server is at capacity{f' ({why})' if why else ''}; retry after {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


class QuotaExceeded(OverloadedError):
    """An account holds its quota of something already (lyre.trust.quotas): 429, Retry-After."""

    code = "quota_exceeded"

    def __init__(self, account: str, key: str, limit: int, what: str, retry_after_s: float):
        LyreError.__init__(self, f"account {account!r} is at its quota: at most {limit} {what} ({key}); retry "
                                 f"after {retry_after_s:.1f} s")
        self.retry_after_s, self.account, self.key = retry_after_s, account, key


class TooManyConnections(LyreError):
    """One client address holds server.max_connections_per_client requests and sockets already."""

    code = "too_many_connections"
    retry_after_s = 1.0


class ServiceUnavailable(LyreError):
    code = "unavailable"


class SynthesisCancelled(LyreError):
    code = "cancelled"

    def __init__(self, message: str = "synthesis was cancelled", reason: str | None = "cancelled"):
        super().__init__(message)
        self.reason = reason  # the scheduler's: cancelled (by the client), slow_consumer, ...


class SynthesisTimeout(LyreError):
    code = "timeout"


class SynthesisFailed(LyreError):
    code = "synthesis_failed"


class InvalidAudio(InvalidRequest):
    """An enrollment upload that is not a usable reference clip (422)."""

    code = "invalid_audio"


class ConsentRequired(InvalidRequest):
    """An enrollment without an explicit, granted consent record (422)."""

    code = "consent_required"


class UploadTooLarge(LyreError):
    code = "upload_too_large"


class VoiceExists(LyreError):
    """The account already has a voice of that name (409)."""

    code = "voice_exists"


class TooManyVoices(LyreError):
    """The account holds voices.max_per_account voices (409)."""

    code = "too_many_voices"


class TooManyConsents(TooManyVoices):
    """The account holds voices.max_per_account consent recordings (409)."""

    code = "too_many_consents"


class TooManyLexicons(TooManyVoices):
    """The account holds voices.max_lexicons_per_account lexicons (409)."""

    code = "too_many_lexicons"


class IdempotencyConflict(VoiceExists):
    """An Idempotency-Key used before with a different input (409)."""

    code = "idempotency_conflict"


class ConsentInUse(LyreError):
    """A consent recording that voices were created with: they go first (409)."""

    code = "consent_in_use"


class NotReady(ConsentInUse):
    """What is asked for does not exist yet (an item's audio before it is complete) (409)."""

    code = "not_ready"


class DatabaseError(LyreError):
    """The voices/audit database cannot be opened, migrated, reached or written (503)."""

    code = "database_unavailable"


class StorageError(ServiceUnavailable):
    """The batch results store (lyre.storage.results: S3 or a compatible one) cannot be reached or
    refuses a request (503: a ServiceUnavailable, so ``lyre.api.common.classify`` maps it to 503/UNAVAILABLE)."""

    code = "storage_unavailable"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, malformed or cannot be fetched."""


class BuildError(RuntimeError):
    """The offline engine build cannot go ahead; the message says why and what to do."""


def shorten(value: object, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters, for echoing client input in an error message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 15]}...({len(text)} chars)"
