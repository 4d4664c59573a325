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

from lyre.api.http.schemas import SCHEMAS
from lyre.audio.formats import CONTENT_TYPES

_REQUEST_ID = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}}
_ERRORS = {
    400: "malformed JSON or multipart, wrong types, unknown fields, not a WebSocket handshake, or more than one "
         "Authorization header",
    401: "missing, wrong or expired API key or client token (a key: only when API keys are configured: "
         "server.api_keys, server.api_key)",
    403: "a browser request from a page whose origin is not allowed (server.cors_origins), or beyond the scope "
         "of the client token (a voice it may not speak; a token minting tokens)",
    404: "unknown voice, consent recording or lexicon (another account's are unknown too)",
    409: "the account already has a voice of that name, or holds voices.max_per_account voices (or consent "
         "recordings; or voices.max_lexicons_per_account lexicons), or a consent recording that voices were created "
         "with is to be deleted",
    413: "request body over server.max_body_bytes (enrollment audio: voices.max_upload_bytes; a lexicon: "
         "voices.max_lexicon_bytes)",
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


_VOICE_ID = [{"name": "voice_id", "in": "path", "required": True, "schema": {"type": "string"},
              "description": "a cloned voice's id (v_ + 16 characters) or a built-in voice's name"}]


def _voices() -> dict[str, Any]:
    form = {"multipart/form-data": {"schema": {"$ref": "#/components/schemas/Enrollment"},
                                    "encoding": {"audio": {"contentType": "application/octet-stream, audio/*"}}}}
    return {
        "/v1/voices": {
            "get": _v1({"operationId": "listVoices", "summary": "Built-in voices and the caller's cloned voices",
                        "responses": _json("the voices", "VoiceList", 401, 429, 503)}),
            "post": _v1({"operationId": "enrollVoice", "summary": "Clone a voice from a reference recording, with "
                         "the speaker's consent", "requestBody": {"required": True, "content": form},
                         "responses": _json("the new voice (Location names it)", "Voice", 400, 401, 409, 413, 422,
                                            429, 503, status=201)}),
        },
        "/v1/voices/{voice_id}": {
            "get": _v1({"operationId": "getVoice", "summary": "One voice", "parameters": _VOICE_ID,
                        "responses": _json("the voice", "Voice", 401, 404, 429, 503)}),
            "delete": _v1({"operationId": "deleteVoice", "summary": "Delete a cloned voice, its audio and every "
                           "cached state of it (a synthesis already running finishes)", "parameters": _VOICE_ID,
                           "responses": {"204": {"description": "deleted", "headers": dict(_REQUEST_ID)},
                                         **{str(e): _error(e) for e in (400, 401, 404, 429, 503)}}}),
        },
        "/v1/voices/{voice_id}/consent": {
            "get": _v1({"operationId": "getConsent", "summary": "A cloned voice's consent record",
                        "parameters": _VOICE_ID, "responses": _json("the record", "Consent", 400, 401, 404, 429,
                                                                      503)}),
        },
    }


def _lexicons() -> dict[str, Any]:
    lexicon_id = [{"name": "lexicon_id", "in": "path", "required": True, "schema": {"type": "string"},
                   "description": "a lexicon's id (lex_ + 16 characters)"}]
    body = {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/LexiconCreate"}}}}
    return {
        "/v1/lexicons": {
            "get": _v1({"operationId": "listLexicons", "summary": "The caller's pronunciation lexicons, oldest first",
                        "responses": _json("the lexicons", "LexiconList", 503)}),
            "post": _v1({"operationId": "createLexicon", "summary": "Add a pronunciation lexicon (W3C PLS 1.0); 400 "
                         "names the line of what is not valid PLS", "requestBody": body,
                         "responses": _json("the new lexicon (Location names it)", "Lexicon", 400, 409, 413, 422, 503,
                                            status=201)}),
        },
        "/v1/lexicons/{lexicon_id}": {
            "get": _v1({"operationId": "getLexicon", "summary": "One lexicon, with its PLS document",
                        "parameters": lexicon_id, "responses": _json("the lexicon", "Lexicon", 404, 503)}),
            "delete": _v1({"operationId": "deleteLexicon", "summary": "Delete a lexicon (requests from then on cannot "
                           "name it)", "parameters": lexicon_id,
                           "responses": {"204": {"description": "deleted", "headers": dict(_REQUEST_ID)},
                                         **{str(e): _error(e) for e in (404, 503)}}}),
        },
    }


def _openai_voices() -> dict[str, Any]:
    """OpenAI's audio.voices and audio.voice_consents (:mod:`lyre.api.http.openai_voices`)."""
    def form(schema: str, file: str) -> dict[str, Any]:
        return {"required": True, "content": {"multipart/form-data": {
            "schema": {"$ref": f"#/components/schemas/{schema}"},
            "encoding": {file: {"contentType": "application/octet-stream, audio/*"}}}}}

    page = [{"name": "after", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "the last id of the previous page"},
            {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}}]
    consent_id = [{"name": "consent_id", "in": "path", "required": True, "schema": {"type": "string"},
                   "description": "a consent recording's id (cons_ + 16 characters)"}]
    voice_id = [{**_VOICE_ID[0], "description": "a cloned voice's id (v_ + 16 characters; a built-in voice's name: "
                 "400)"}]
    return {
        "/v1/audio/voice_consents": {
            "get": _v1({"operationId": "listVoiceConsents", "summary": "The caller's consent recordings, newest first "
                        "(OpenAI's voice_consents.list)", "parameters": page,
                        "responses": _json("a page of them", "VoiceConsentList", 400, 503)}),
            "post": _v1({"operationId": "createVoiceConsent", "summary": "Upload a recording of the speaker's consent "
                         "(OpenAI's voice_consents.create)", "requestBody": form("VoiceConsentUpload", "recording"),
                         "responses": _json("the consent recording", "VoiceConsent", 400, 409, 413, 422, 503)}),
        },
        "/v1/audio/voice_consents/{consent_id}": {
            "get": _v1({"operationId": "getVoiceConsent", "summary": "One consent recording", "parameters": consent_id,
                        "responses": _json("the consent recording", "VoiceConsent", 404, 503)}),
            "post": _v1({"operationId": "updateVoiceConsent", "summary": "A new label (OpenAI's "
                         "voice_consents.update)", "parameters": consent_id, "requestBody": {
                             "required": True, "content": {"application/json": {
                                 "schema": {"$ref": "#/components/schemas/ConsentRename"}}}},
                         "responses": _json("the consent recording", "VoiceConsent", 400, 404, 413, 503)}),
            "delete": _v1({"operationId": "deleteVoiceConsent", "summary": "Delete a consent recording (409 while "
                           "voices created with it exist)", "parameters": consent_id,
                           "responses": _json("deleted", "VoiceConsentDeleted", 404, 409, 503)}),
        },
        "/v1/audio/voices": {
            "get": _v1({"operationId": "listCustomVoices", "summary": "The caller's cloned voices in OpenAI's form, "
                        "newest first (not in OpenAI's API)", "parameters": page,
                        "responses": _json("a page of them", "AudioVoiceList", 400, 503)}),
            "post": _v1({"operationId": "createCustomVoice", "summary": "Clone a voice from a sample and a consent "
                         "recording (OpenAI's voices.create; Lyre also needs the transcript)",
                         "requestBody": form("AudioVoiceUpload", "audio_sample"),
                         "responses": _json("the new voice", "AudioVoice", 400, 404, 409, 413, 422, 503)}),
        },
        "/v1/audio/voices/{voice_id}": {
            "get": _v1({"operationId": "getCustomVoice", "summary": "One cloned voice in OpenAI's form (not in "
                        "OpenAI's API)", "parameters": voice_id,
                        "responses": _json("the voice", "AudioVoice", 400, 404, 503)}),
            "delete": _v1({"operationId": "deleteCustomVoice", "summary": "Delete a cloned voice, as DELETE "
                           "/v1/voices/{voice_id} (its consent recording stays; OpenAI's voices.delete)",
                           "parameters": voice_id,
                           "responses": _json("deleted", "AudioVoiceDeleted", 400, 404, 503)}),
        },
    }


_EVERY = (400, 403, 415)  # every route: two Authorization headers, a page not allowed, an encoded body
_V1 = (401, 429)  # every /v1/ route: the API key, the per-client limit


def _v1(operation: dict[str, Any]) -> dict[str, Any]:
    """An operation under /v1/: an API key when one is configured, and the per-client limit."""
    return {**operation, "security": [{}, {"apiKey": []}], "responses": _with(operation["responses"], _V1)}


def _with(responses: dict[str, Any], errors: tuple[int, ...]) -> dict[str, Any]:
    """``responses`` and the error answers ``errors`` it does not describe otherwise."""
    return {**responses, **{str(e): _error(e) for e in errors if str(e) not in responses}}


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
