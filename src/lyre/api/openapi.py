"""The OpenAPI 3.1 document of the REST surface, served at ``GET /openapi.json``.

Request bodies come from the pydantic models that validate them (:mod:`lyre.options`), so the
document cannot drift from what is accepted; response bodies are described by the models below.
``tests/api/test_openapi.py`` keeps the rest true: it checks the document against the OpenAPI 3.1
schema, that every route the app serves is in it (and nothing else), and validates real responses
of the running server (successes and every documented error) against it with ``openapi-core``.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lyre.audio import CONTENT_TYPES
from lyre.options import SpeechBody, WsMessage


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(_Shape):
    message: str = Field(description="what went wrong, in words")
    type: str = Field(description="invalid_request_error, authentication_error, not_found_error, "
                      "overloaded_error, service_unavailable, timeout_error or server_error")
    code: str = Field(description="a stable code, e.g. unknown_voice, unsupported_format, too_many_connections")


class Error(_Shape):
    """Every error answer (OpenAI's form)."""

    error: ErrorDetail


class Voice(_Shape):
    name: str
    aliases: list[str] = Field(description="other names for this voice (OpenAI's voice names by default)")


class VoiceList(_Shape):
    voices: list[Voice]
    default: str = Field(description="the voice used when a request names none")


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


class Health(_Shape):
    status: str = Field(description="ok, draining or unavailable")
    model: str | None = Field(description="where the checkpoint was loaded from")
    demo: bool = Field(description="true on the demo checkpoint (random weights: its audio is noise)")


SCHEMAS: tuple[type[BaseModel], ...] = (Error, VoiceList, ModelList, Stats, Health, SpeechBody, WsMessage)

_REQUEST_ID = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}}
_ERRORS = {
    400: "malformed JSON, wrong types, unknown fields, or not a WebSocket handshake",
    401: "missing or wrong API key (only when server.api_key is set)",
    404: "unknown voice",
    413: "request body over server.max_body_bytes",
    422: "a value out of range or unsupported (format, sample rate, speed, text too long)",
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


def _v1(operation: dict[str, Any]) -> dict[str, Any]:
    """An operation under /v1/: an API key when one is configured."""
    return {**operation, "security": [{}, {"apiKey": []}]}


def _speech() -> dict[str, Any]:
    audio: dict[str, Any] = {ctype: {} for ctype in dict.fromkeys(CONTENT_TYPES.values())}  # binary: no schema (3.1)
    audio["text/event-stream"] = {"schema": {"description": (  # no type: the body is bytes to a validator
        "'data: {json}' events: speech.audio.delta {audio: base64}, then speech.audio.done {usage, "
        "metrics}, or an error event when the synthesis fails after the first audio")}}
    ok = {"description": (
        "the audio, streamed from its first chunk (FLAC is sent whole, with its length in its header, so "
        "libsndfile can read it); a failure after the first bytes cuts the body (or sends an SSE error event)"),
        "headers": {**_REQUEST_ID, "X-Sample-Rate": {"description": "sample rate of the audio",
                                                     "schema": {"type": "string"}}},
        "content": audio}
    return _v1({
        "operationId": "createSpeech",
        "summary": "Synthesize speech (OpenAI's /v1/audio/speech)",
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SpeechBody"}}}},
        "responses": {"200": ok, **{str(e): _error(e) for e in _ERRORS}},
    })


def _stream() -> dict[str, Any]:
    return _v1({
        "operationId": "streamSpeech",
        "summary": "WebSocket: text in, audio out",
        "description": (
            "Upgrade to a WebSocket. Send JSON messages (schema WsMessage): {text, voice} speaks one text; "
            "{context_id, append|flush|end|cancel} drive incremental utterances. The server sends binary audio "
            "(or JSON audio frames with a context_id), then {done: true, metrics}; bad messages are answered "
            "{error: {...}}."),
        "responses": {"101": {"description": "switching to the WebSocket protocol"},
                      **{str(e): _error(e) for e in (400, 401, 429, 503)}},
    })


@cache
def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document (built once)."""
    schemas: dict[str, Any] = {}
    for model in SCHEMAS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    try:
        release = version("lyre")
    except PackageNotFoundError:  # pragma: no cover - running from a tree without installing
        release = "0"
    text = {"text/plain": {"schema": {"type": "string"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Lyre", "version": release,
                 "description": "Streaming text-to-speech for Orpheus-style models. gRPC (lyre.v1 and Riva's "
                                "API) is served on its own port and described by protos/."},
        "paths": {
            "/v1/audio/speech": {"post": _speech()},
            "/v1/audio/stream": {"get": _stream()},
            "/v1/voices": {"get": _v1({"operationId": "listVoices", "summary": "The voices and their aliases",
                                       "responses": _json("the voices", "VoiceList", 401, 429)})},
            "/v1/models": {"get": _v1({"operationId": "listModels", "summary": "The model served (OpenAI's form)",
                                       "responses": _json("the models", "ModelList", 401, 429)})},
            "/v1/stats": {"get": _v1({"operationId": "getStats", "summary": "Scheduler, KV cache and engine figures",
                                      "responses": _json("the figures", "Stats", 401, 429)})},
            "/health": {"get": {"operationId": "health", "summary": "Liveness: the engine is loaded and running",
                                "responses": {
                                    "200": {"description": "alive", "headers": dict(_REQUEST_ID), "content": {
                                        "application/json": {"schema": {"$ref": "#/components/schemas/Health"}}}},
                                    "503": {"description": "draining, or the engine is not running",
                                            "headers": dict(_REQUEST_ID), "content": {"application/json": {
                                                "schema": {"$ref": "#/components/schemas/Health"}}}}}}},
            "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus metrics",
                                 "responses": {"200": {"description": "the text exposition format",
                                                       "headers": dict(_REQUEST_ID), "content": text}}}},
            "/openapi.json": {"get": {"operationId": "openapi", "summary": "This document",
                                      "responses": {"200": {"description": "OpenAPI 3.1",
                                                            "headers": dict(_REQUEST_ID),
                                                            "content": {"application/json": {
                                                                "schema": {"type": "object"}}}}}}},
        },
        "components": {
            "schemas": schemas,
            "headers": {"X-Request-Id": {
                "description": "names the request: the client's own X-Request-Id when it sent a sane one "
                               "(up to 128 of A-Za-z0-9._:-), else a new one",
                "required": True, "schema": {"type": "string"}}},
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer",
                                           "description": "server.api_key, when set (header only)"}},
        },
    }
