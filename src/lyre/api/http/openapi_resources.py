"""The OpenAPI document's paths for what an account owns: cloned voices, OpenAI's voices and
consents, pronunciation lexicons, batch jobs (:mod:`lyre.api.http.openapi`)."""

from __future__ import annotations

from typing import Any

from lyre.api.http.openapi_parts import _REQUEST_ID, _error, _json, _v1
from lyre.audio.formats import CONTENT_TYPES

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


def _batches() -> dict[str, Any]:
    """Batch jobs (:mod:`lyre.api.http.batches`)."""
    batch_id = [{"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"},
                 "description": "a batch's id (batch_ + 24 characters)"}]
    jsonl = {"content": {"application/jsonl": {"schema": {"type": "string"}}}, "description": "JSONL, one object a line"}
    body = {"required": True, "description": "the JSONL input itself: one item a line (docs/batch.md)",
            "content": {t: {"schema": {"type": "string", "minLength": 1}}
                        for t in ("application/jsonl", "application/x-ndjson", "text/plain")}}
    query = [{"name": "completion_window", "in": "query", "required": False,
              "schema": {"type": "string", "pattern": "^[0-9]{1,9}[smhd]$"},
              "description": "how long its items may wait: <n>s|m|h|d (default batch.completion_window, 24h)"},
             {"name": "metadata", "in": "query", "required": False, "schema": {"type": "string"},
              "description": "a JSON object of up to 16 string pairs"},
             {"name": "Idempotency-Key", "in": "header", "required": False,
              "schema": {"type": "string", "minLength": 1, "maxLength": 255},
              "description": "a resubmission with the same key and input answers the same batch"}]
    page = [{"name": "after", "in": "query", "required": False, "schema": {"type": "string"}},
            {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}}]
    return {
        "/v1/batches": {
            "post": _v1({"operationId": "createBatch", "summary": "Submit a batch of speech items (checked whole: "
                         "400 lists every bad line and stores nothing)", "parameters": query, "requestBody": body,
                         "responses": _json("the batch (Location names it)", "Batch", 400, 409, 413, 415, 422,
                                            429, 503)}),
            "get": _v1({"operationId": "listBatches", "summary": "The caller's batches, newest first",
                        "parameters": page, "responses": _json("the batches", "BatchList", 400, 404, 503)}),
        },
        "/v1/batches/{batch_id}": {
            "get": _v1({"operationId": "getBatch", "summary": "One batch", "parameters": batch_id,
                        "responses": _json("the batch", "Batch", 404, 503)})},
        "/v1/batches/{batch_id}/cancel": {
            "post": _v1({"operationId": "cancelBatch", "summary": "Cancel a batch: queued items at once, running ones "
                         "at their server's next check", "parameters": batch_id,
                         "responses": _json("the batch", "Batch", 404, 503)})},
        "/v1/batches/{batch_id}/output": {
            "get": _v1({"operationId": "getBatchOutput", "summary": "A JSONL line per completed item, in input order",
                        "parameters": batch_id, "responses": {"200": jsonl, **{str(e): _error(e) for e in (404, 503)}}})},
        "/v1/batches/{batch_id}/errors": {
            "get": _v1({"operationId": "getBatchErrors", "summary": "A JSONL line per failed, cancelled or expired "
                        "item, in input order", "parameters": batch_id,
                        "responses": {"200": jsonl, **{str(e): _error(e) for e in (404, 503)}}})},
        "/v1/batches/{batch_id}/items/{custom_id}/audio": {
            "get": _v1({"operationId": "getBatchItemAudio", "summary": "A completed item's audio file (409 before)",
                        "parameters": [*batch_id, {"name": "custom_id", "in": "path", "required": True,
                                                   "schema": {"type": "string"}}],
                        "responses": {"200": {"description": "the audio file", "headers": dict(_REQUEST_ID),
                                              "content": {ctype: {} for ctype in dict.fromkeys(CONTENT_TYPES.values())}},
                                      **{str(e): _error(e) for e in (404, 409, 503)}}})},
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
