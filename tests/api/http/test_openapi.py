"""``GET /openapi.json`` is a valid OpenAPI 3.1 document of every REST endpoint, and the running
server's real answers — audio in every format, JSON, and each documented error — match it
(validated with ``openapi-core``)."""

from __future__ import annotations

import asyncio
import json

import pytest
import requests
import websockets
from openapi_core import OpenAPI
from openapi_core.contrib.requests import RequestsOpenAPIRequest, RequestsOpenAPIResponse
from openapi_spec_validator import validate

from lyre.api.common import InFlight
from lyre.api.http import playground
from lyre.api.http.app import create_app
from lyre.audio.formats import FORMATS
from lyre.config import load_config
from lyre.service.tts import TTSService
from tests.support.servers import HOLD_SETTINGS, NOT_SERVING, HealthWatch, HeldStream, serve_in_process

SPEECH = "/v1/audio/speech"


@pytest.fixture(scope="module")
def spec(server) -> OpenAPI:
    r = requests.get(server.http + "/openapi.json", timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json")
    document = r.json()
    validate(document)  # the OpenAPI 3.1 meta-schema
    return OpenAPI.from_dict(document)


def conforms(spec: OpenAPI, response: requests.Response) -> requests.Response:
    """``response`` (and the request that produced it) as the document describes them."""
    spec.validate_response(RequestsOpenAPIRequest(response.request), RequestsOpenAPIResponse(response))
    return response


def call(spec: OpenAPI, method: str, url: str, **kwargs) -> requests.Response:
    return conforms(spec, requests.request(method, url, timeout=60, **kwargs))


def test_the_document_lists_exactly_the_routes_the_server_serves(spec, server):
    """Every route but the playground's page and files (for people, not an API: left out, as FastAPI
    leaves out its docs pages)."""
    app = create_app(TTSService(load_config(None)), InFlight())
    served = {(r.method.lower(), r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    pages = {(method.lower(), path) for method, path in playground.ROUTES}
    documented = {(method, path) for path, item in requests.get(server.http + "/openapi.json").json()["paths"].items()
                  for method in item}
    assert pages <= served and served - pages == documented


@pytest.mark.parametrize("path", ["/v1/voices", "/v1/models", "/v1/stats", "/health", "/ready", "/metrics",
                                  "/openapi.json"])
def test_every_get_endpoint_answers_as_documented(spec, server, path):
    r = call(spec, "GET", server.http + path, headers={"X-Request-Id": "doc-check-1"})
    assert r.status_code == 200 and r.headers["X-Request-Id"] == "doc-check-1"


@pytest.mark.parametrize("fmt", FORMATS)
def test_speech_in_every_format_answers_as_documented(spec, server, fmt):
    r = call(spec, "POST", server.http + SPEECH, json={"input": "Documented", "voice": "tara", "response_format": fmt})
    assert r.status_code == 200 and len(r.content) > 0


def test_speech_as_server_sent_events_answers_as_documented(spec, server):
    r = call(spec, "POST", server.http + SPEECH,
             json={"input": "Documented", "response_format": "pcm", "stream_format": "sse"})
    assert r.status_code == 200 and "speech.audio.done" in r.text


@pytest.mark.parametrize("body, status", [
    (b"{not json", 400),
    ({"input": "hi", "colour": "blue"}, 400),
    ({"input": None}, 400),  # the document does not allow null: leave it out
    ({"input": None, "text": "hi"}, 400),
    ({"input": " \n\t"}, 400),  # nothing to speak: the document's pattern asks for a non-space character
    ({"input": "hi", "voice": "bob"}, 404),
    ({"input": "hi", "speed": 9}, 422),
    ({"input": "hi", "response_format": "ogg-vorbis"}, 422),
    ({"input": "x" * 300_000}, 413),
])
def test_speech_errors_answer_as_documented(spec, server, body, status):
    kwargs = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    r = call(spec, "POST", server.http + SPEECH, **kwargs)
    assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "code"}


def test_a_plain_get_of_the_websocket_endpoint_answers_as_documented(spec, server):
    r = call(spec, "GET", server.http + "/v1/audio/stream")
    assert r.status_code == 400 and r.json()["error"]["message"]


def test_an_undocumented_answer_is_caught(spec, server):
    """The check can fail: a status the document does not list for the operation is an error."""
    r = requests.get(server.http + "/v1/voices", timeout=30)
    r.status_code = 418
    with pytest.raises(Exception, match="418|[Uu]nknown|not found"):
        conforms(spec, r)


def test_key_overload_and_drain_answers_match_the_document(spec):
    """401 on every /v1/ route, 429 with Retry-After past the per-client limit (a client behind a
    trusted balancer: counted per request; a direct one is counted from accept), and 503 on /ready
    and new speech while draining. (In-process: the drain is the one SIGTERM begins.)"""
    auth = {"Authorization": "Bearer s3cret"}
    client = {**auth, "X-Forwarded-For": "203.0.113.9"}
    # a held stream reads nothing for a while: never a slow consumer here
    with serve_in_process("server.api_key=s3cret", "server.max_connections_per_client=2",
                          "server.trusted_proxies=[127.0.0.1]",
                          "server.drain_timeout_s=120", *HOLD_SETTINGS) as srv:
        for method, path in (("GET", "/v1/voices"), ("GET", "/v1/models"), ("GET", "/v1/stats"),
                             ("POST", SPEECH), ("GET", "/v1/audio/stream")):
            r = call(spec, method, srv.http + path, json={"input": "hi"} if method == "POST" else None)
            assert r.status_code == 401, path

        async def held_sockets():
            url = srv.http.replace("http", "ws") + "/v1/audio/stream"
            async with websockets.connect(url, additional_headers=client), \
                    websockets.connect(url, additional_headers=client):
                return await asyncio.to_thread(call, spec, "GET", srv.http + "/v1/voices", headers=client)

        r = asyncio.run(held_sockets())
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1

        # a long synthesis keeps the server draining while new work is refused
        with HeldStream(srv, headers=auth):
            with HealthWatch(srv, "") as alive:
                srv.terminate()  # what SIGTERM begins
                alive.until(NOT_SERVING)  # the drain began
            ready = call(spec, "GET", srv.http + "/ready")
            assert ready.status_code == 503 and ready.json()["reason"] == "draining"
            health = call(spec, "GET", srv.http + "/health")
            assert health.status_code == 200 and health.json()["status"] == "draining"  # alive while it drains
            r = call(spec, "POST", srv.http + SPEECH, headers=auth, json={"input": "too late"})
            assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
        # the last stream hung up: the drain completes
        assert srv.wait() == 0


def test_the_speech_body_schema_is_the_one_requests_are_validated_with(spec, server):
    """The request schema comes from lyre.service.options.SpeechBody: every option it allows is documented."""
    from lyre.service.options import SpeechBody

    document = requests.get(server.http + "/openapi.json").json()
    body = document["components"]["schemas"]["SpeechBody"]
    assert set(body["properties"]) == set(SpeechBody.model_fields) and body["additionalProperties"] is False
    assert set(body["properties"]["response_format"]["enum"]) == {*FORMATS, None}
    assert json.dumps(body).count("description") >= len(SpeechBody.model_fields)
    for text in ("input", "text"):  # a string when given: null is refused (test_speech_errors_answer_as_documented)
        assert body["properties"][text]["type"] == "string" and "default" not in body["properties"][text]


def test_voice_endpoints_answer_as_documented(spec, server):
    from tests.support.audio_files import audio_file, speechlike

    wav = audio_file(speechlike(4.0, 16000), 16000, "wav")
    consent = json.dumps({"granted": True, "speaker": "Doc", "source": "self_recorded"})
    fields = {"transcript": "Documented words.", "name": "Doc", "consent": consent}
    r = call(spec, "POST", server.http + "/v1/voices", files={"audio": ("doc.wav", wav, "audio/wav")}, data=fields)
    assert r.status_code == 201 and r.headers["Location"] == f"/v1/voices/{r.json()['id']}"
    vid = r.json()["id"]
    assert call(spec, "POST", server.http + "/v1/voices", files={"audio": ("doc.wav", wav, "audio/wav")},
                data=fields).status_code == 409
    assert call(spec, "POST", server.http + "/v1/voices", files={"audio": ("x.wav", b"nope" * 100, "audio/wav")},
                data={**fields, "name": "Doc2"}).status_code == 422
    assert call(spec, "POST", server.http + "/v1/voices", json={"audio": "..."}).status_code == 400
    assert call(spec, "GET", server.http + "/v1/voices").json()["voices"][-1]["id"] == vid
    for path in (f"/v1/voices/{vid}", f"/v1/voices/{vid}/consent", "/v1/voices/tara"):
        assert call(spec, "GET", server.http + path).status_code == 200, path
    assert call(spec, "GET", server.http + "/v1/voices/tara/consent").status_code == 400
    assert call(spec, "DELETE", server.http + f"/v1/voices/{vid}").status_code == 204
    for method, path in (("GET", f"/v1/voices/{vid}"), ("DELETE", f"/v1/voices/{vid}"),
                         ("GET", f"/v1/voices/{vid}/consent")):
        assert call(spec, method, server.http + path).status_code == 404


def test_openai_voice_and_consent_endpoints_answer_as_documented(spec, server):
    """OpenAI's audio.voice_consents and audio.voices (lyre.api.http.openai_voices): successes and errors."""
    from tests.support.audio_files import audio_file, speechlike
    from tests.support.voices import TRANSCRIPT

    wav = audio_file(speechlike(4.0, 16000), 16000, "wav")
    consents, voices = server.http + "/v1/audio/voice_consents", server.http + "/v1/audio/voices"
    label = {"name": "Doc", "language": "en-US"}
    r = call(spec, "POST", consents, files={"recording": ("c.wav", wav, "audio/wav")}, data=label)
    assert r.status_code == 200 and r.json()["object"] == "audio.voice_consent"
    cid = r.json()["id"]
    assert call(spec, "POST", consents, files={"recording": ("x.wav", b"nope" * 100, "audio/wav")},
                data=label).status_code == 422
    assert call(spec, "POST", consents, json=label).status_code == 400
    assert call(spec, "GET", consents, params={"limit": 1}).json()["data"][0]["id"] == cid
    assert call(spec, "GET", consents, params={"limit": 0}).status_code == 400
    assert call(spec, "GET", f"{consents}/{cid}").status_code == 200
    assert call(spec, "POST", f"{consents}/{cid}", json={"name": "Doc 2"}).json()["name"] == "Doc 2"
    assert call(spec, "POST", f"{consents}/{cid}", data="x", headers={"Content-Type": "text/plain"}).status_code == 415
    fields = {"consent": cid, "name": "DocVoice", "transcript": TRANSCRIPT}
    r = call(spec, "POST", voices, files={"audio_sample": ("v.wav", wav, "audio/wav")}, data=fields)
    assert r.status_code == 200 and r.json()["object"] == "audio.voice"
    vid = r.json()["id"]
    assert call(spec, "POST", voices, files={"audio_sample": ("v.wav", wav, "audio/wav")}, data=fields).status_code == 409
    assert call(spec, "POST", voices, files={"audio_sample": ("v.wav", wav, "audio/wav")},
                data={**fields, "consent": "cons_AAAAAAAAAAAAAAAA"}).status_code == 404
    assert call(spec, "GET", voices, params={"limit": 1}).json()["data"][0]["id"] == vid
    assert call(spec, "GET", f"{voices}/{vid}").status_code == 200
    assert call(spec, "GET", f"{voices}/tara").status_code == 400
    assert call(spec, "GET", server.http + f"/v1/voices/{vid}/consent").json()["consent"]["consent_id"] == cid
    assert call(spec, "DELETE", f"{consents}/{cid}").status_code == 409
    assert call(spec, "DELETE", f"{voices}/{vid}").json() == {"id": vid, "deleted": True, "object": "audio.voice.deleted"}
    assert call(spec, "DELETE", f"{voices}/{vid}").status_code == 404
    assert call(spec, "DELETE", f"{consents}/{cid}").json()["deleted"] is True
    for method in ("GET", "DELETE"):
        assert call(spec, method, f"{consents}/{cid}").status_code == 404
