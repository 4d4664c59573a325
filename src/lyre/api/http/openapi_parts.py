"""What every operation of the OpenAPI document shares: the error answers, the request-id header, the
shapes of a JSON answer and of a /v1/ operation (:mod:`lyre.api.http.openapi`)."""

from __future__ import annotations

from typing import Any

_REQUEST_ID = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}}
_ERRORS = {
    400: "malformed JSON or multipart, wrong types, unknown fields, not a WebSocket handshake, or more than one "
         "Authorization header",
    401: "missing, wrong or expired API key or client token (a key: only when API keys are configured: "
         "server.api_keys, server.api_key)",
    403: "a browser request from a page whose origin is not allowed (server.cors_origins), or beyond the scope "
         "of the client token (a voice it may not speak; a token minting tokens)",
    404: "unknown voice, consent recording, lexicon or batch (another account's are unknown too)",
    409: "the account already has a voice of that name, or holds voices.max_per_account voices (or consent "
         "recordings; or voices.max_lexicons_per_account lexicons), or a consent recording that voices were created "
         "with is to be deleted; an Idempotency-Key used for another batch input; a batch item's audio before it "
         "is complete",
    413: "request body over server.max_body_bytes (enrollment audio: voices.max_upload_bytes; a lexicon: "
         "voices.max_lexicon_bytes; a batch input: accounts.batch_input_bytes)",
    415: "a Content-Encoding other than identity (send the body unencoded), or a JSON route's body sent with "
         "another Content-Type",
    422: "a value out of range or unsupported (format, sample rate, speed, text too long; enrollment: audio that "
         "is not a usable 3-30 s clip, a transcript it cannot hold, consent missing or not granted)",
    429: "overloaded, or too many open requests from this client (see Retry-After)",
    500: "the synthesis failed",
    503: "shutting down, or the engine stopped",
    504: "the synthesis passed its deadline",
}


def _error(status: int) -> dict[str, Any]:
    headers = dict(_REQUEST_ID)
    if status == 429:
        headers["Retry-After"] = {"description": "seconds to wait before trying again",
                                  "schema": {"type": "string"}}
    return {"description": _ERRORS[status], "headers": headers,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _json(description: str, schema: str, *errors: int, status: int = 200) -> dict[str, Any]:
    responses: dict[str, Any] = {str(status): {
        "description": description, "headers": dict(_REQUEST_ID),
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}}
    responses.update({str(e): _error(e) for e in errors})
    return responses


_EVERY = (400, 403, 415)  # every route: two Authorization headers, a page not allowed, an encoded body
_V1 = (401, 429)  # every /v1/ route: the API key, the per-client limit


def _v1(operation: dict[str, Any]) -> dict[str, Any]:
    """An operation under /v1/: an API key when one is configured, and the per-client limit."""
    return {**operation, "security": [{}, {"apiKey": []}], "responses": _with(operation["responses"], _V1)}


def _with(responses: dict[str, Any], errors: tuple[int, ...]) -> dict[str, Any]:
    """``responses`` and the error answers ``errors`` it does not describe otherwise."""
    return {**responses, **{str(e): _error(e) for e in errors if str(e) not in responses}}
