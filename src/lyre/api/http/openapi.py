"""The OpenAPI 3.1 document of the REST surface, served at ``GET /openapi.json``.

Request bodies come from the pydantic models that validate them (:mod:`lyre.service.options`), so the
document cannot drift from what is accepted; response bodies are described by the models of
:mod:`lyre.api.http.schemas`.
``tests/api/http/test_openapi.py`` keeps the rest true: it checks the document against the OpenAPI 3.1
schema, that every route the app serves is in it (and nothing else), and validates real responses
of the running server (successes and every documented error) against it with ``openapi-core``.
The playground's page and files (``GET /``, :mod:`lyre.api.http.playground`) are for people, not an
API, and are left out (as FastAPI leaves out its docs pages).
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from lyre.api.http.openapi_parts import _ERRORS, _EVERY, _REQUEST_ID, _error, _json, _v1, _with
from lyre.api.http.openapi_resources import _batches, _lexicons, _openai_voices, _voices
from lyre.api.http.schemas import SCHEMAS
from lyre.audio.formats import CONTENT_TYPES


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
            "{error: {...}}. A browser, which cannot send an Authorization header here, passes a client token "
            "(POST /v1/auth/tokens) as ?token= or as the subprotocol 'lyre-token.<token>'; an API key in the URL "
            "is refused."),
        "parameters": [{"name": "token", "in": "query", "required": False, "schema": {"type": "string"},
                        "description": "a client token (never an API key)"}],
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
    paths = {
        "/v1/audio/speech": {"post": _speech()},
        "/v1/audio/stream": {"get": _stream()},
        "/v1/auth/tokens": {"post": _v1({
            "operationId": "createToken", "summary": "A short-lived client token for a browser (or any client that "
            "must not hold the API key), bound to the key's account",
            "requestBody": {"required": False, "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/TokenRequest"}}}},
            "responses": _json("the token", "TokenGrant", 400, 401, 404, 422, status=201)})},
        **_voices(),
        **_openai_voices(),
        **_lexicons(),
        **_batches(),
        "/v1/audio/verify": {"post": _v1({
            "operationId": "verifyWatermark", "summary": "Whether audio carries Lyre's watermark, with a score",
            "requestBody": {"required": True, "content": {
                "multipart/form-data": {"schema": {"$ref": "#/components/schemas/Verification"}},
                "application/octet-stream": {}, "audio/*": {}}},
            "responses": _json("the verdict", "VerifyResult", 400, 401, 413, 422, 429)})},
        "/v1/models": {"get": _v1({"operationId": "listModels", "summary": "The model served (OpenAI's form)",
                                   "responses": _json("the models", "ModelList", 401, 429)})},
        "/v1/models/{model}": {"get": _v1({
            "operationId": "getModel", "summary": "One model by name (OpenAI's models.retrieve)",
            "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"},
                            "description": "a name of GET /v1/models (the checkpoint id holds a slash)"}],
            "responses": _json("the model", "Model", 404)})},
        "/v1/stats": {"get": _v1({"operationId": "getStats", "summary": "Scheduler, KV cache and engine figures",
                                  "responses": _json("the figures", "Stats", 401, 429)})},
        "/ready": {"get": {"operationId": "ready", "summary": "Readiness: send me new callers",
                           "responses": {**_json("ready", "Ready"),
                                         **_json("draining, admission full, or not running", "Ready", status=503)}}},
        "/health": {"get": {"operationId": "health", "summary": "Liveness: the engine is loaded and running "
                            "(draining included)",
                            "responses": {**_json("alive", "Health"),
                                          **_json("the engine is not running", "Health", status=503)}}},
        "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus metrics (with several accounts: an "
                             "operator account's key)",
                             "responses": {"200": {"description": "the text exposition format",
                                                   "headers": dict(_REQUEST_ID), "content": text},
                                           "401": _error(401)}}},
        "/openapi.json": {"get": {"operationId": "openapi", "summary": "This document",
                                  "responses": {"200": {"description": "OpenAPI 3.1",
                                                        "headers": dict(_REQUEST_ID),
                                                        "content": {"application/json": {
                                                            "schema": {"type": "object"}}}}}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Lyre", "version": release,
                 "description": "Streaming text-to-speech for Orpheus-style models. gRPC (lyre.v1 and Riva's "
                                "API) is served on its own port and described by protos/."},
        "paths": {path: {method: {**op, "responses": _with(op["responses"], _EVERY)} for method, op in item.items()}
                  for path, item in paths.items()},
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
