"""OpenAI's custom voices and voice consents with the real openai SDK against a real server:
``client.audio.voice_consents`` (create, retrieve, update, list, delete) and ``client.audio.voices``
(create, delete; Lyre's list and retrieve through the SDK's generic calls), a created voice spoken
with ``voice={"id": ...}``, one account never seeing another's, and bad input answered with a
clear OpenAI-shaped error that stores nothing."""

from __future__ import annotations

import time

import openai
import pytest
import requests
from openai import OpenAI
from openai.pagination import SyncCursorPage
from openai.types.audio import Voice, VoiceConsentDeleted, VoiceDeleted

from tests.support.audio_files import audio_file, speechlike
from tests.support.servers import MAX_TOKENS, serve_in_process
from tests.support.voices import TRANSCRIPT

ALICE, BOB, CAROL = "key-alice-0123456789", "key-bob-9876543210", "key-carol-5555555555"
PCM_BYTES = MAX_TOKENS // 7 * 2048 * 2
NEVER = "cons_AAAAAAAAAAAAAAAA"  # well formed, never made


@pytest.fixture(scope="module")
def srv():
    with serve_in_process(f"server.api_keys={{{ALICE}: alice, {BOB}: bob, {CAROL}: carol}}",
                          "voices.max_per_account=4") as s:
        yield s
        assert s.stop() == 0


def sdk(srv, key: str = ALICE) -> OpenAI:
    return OpenAI(base_url=srv.http + "/v1", api_key=key, max_retries=0, timeout=120)


def wav(seconds: float = 4.0, seed: int = 0) -> bytes:
    return audio_file(speechlike(seconds, 16000, seed=seed), 16000, "wav")


def record(client: OpenAI, name: str = "Ann", seed: int = 0):
    return client.audio.voice_consents.create(name=name, language="en-US",
                                              recording=("consent.wav", wav(seed=seed), "audio/wav"))


def clone(client: OpenAI, consent: str, name: str = "Ann", **kwargs):
    return client.audio.voices.create(name=name, consent=consent, audio_sample=("ann.wav", wav(seed=7), "audio/wav"),
                                      extra_body={"transcript": TRANSCRIPT}, **kwargs)


def cloned_voices(client: OpenAI) -> list[str]:
    return [v.id for v in client.get_api_list("/audio/voices", model=Voice, page=SyncCursorPage[Voice])]


def refused(call, status: int, code: str | None = None) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as e:
        call()
    assert e.value.status_code == status, e.value.body
    assert set(e.value.body) == {"message", "type", "code"} and len(e.value.message) < 400
    if code is not None:
        assert e.value.code == code, e.value.body
    return e.value


def test_a_consent_recording_authorises_a_voice_that_speaks_and_is_deleted(srv):
    client = sdk(srv)
    before = time.time()
    consent = record(client, "Ann's consent")
    assert consent.object == "audio.voice_consent" and consent.id.startswith("cons_") and len(consent.id) == 21
    assert consent.name == "Ann's consent" and consent.language == "en-US"
    assert int(before) <= consent.created_at <= time.time()
    assert client.audio.voice_consents.retrieve(consent.id) == consent
    renamed = client.audio.voice_consents.update(consent.id, name="Ann")
    assert renamed.model_dump() == {**consent.model_dump(), "name": "Ann"}
    assert client.audio.voice_consents.retrieve(consent.id).name == "Ann"
    assert [c.id for c in client.audio.voice_consents.list()] == [consent.id]

    voice = clone(client, consent.id)
    assert voice.object == "audio.voice" and voice.type == "audio_sample" and voice.name == "Ann"
    assert voice.id.startswith("v_") and voice.prompt is None and int(before) <= voice.created_at <= time.time()
    refused(lambda: clone(client, consent.id), 409, "voice_exists")  # names are unique per account
    # one registry: Lyre's own routes show the voice and its consent record, which names the recording
    assert voice.id in [v["id"] for v in client.get("/voices", cast_to=object)["voices"]]
    kept = client.get(f"/voices/{voice.id}/consent", cast_to=object)["consent"]
    assert kept["consent_id"] == consent.id and kept["granted"] is True and kept["speaker"] == "Ann"
    assert kept["account"] == "alice" and consent.id in kept["statement"]
    assert client.get(f"/audio/voices/{voice.id}", cast_to=Voice) == voice
    assert cloned_voices(client) == [voice.id]

    pcm = client.audio.speech.create(model="tts-1", voice={"id": voice.id}, input="Hello, in my own voice.",
                                     response_format="pcm").content
    assert len(pcm) == PCM_BYTES

    in_use = refused(lambda: client.audio.voice_consents.delete(consent.id), 409, "consent_in_use")
    assert voice.id in in_use.message
    assert client.audio.voice_consents.retrieve(consent.id).name == "Ann"  # refused: nothing was deleted

    assert client.audio.voices.delete(voice.id) == VoiceDeleted(id=voice.id, deleted=True, object="audio.voice.deleted")
    refused(lambda: client.audio.voices.delete(voice.id), 404, "unknown_voice")
    refused(lambda: client.audio.speech.create(model="tts-1", voice={"id": voice.id}, input="Gone.",
                                               response_format="pcm"), 404, "unknown_voice")
    assert cloned_voices(client) == []
    # deleting a voice keeps its consent recording (as OpenAI's); then it can go
    assert client.audio.voice_consents.retrieve(consent.id).name == "Ann"
    assert client.audio.voice_consents.delete(consent.id) == VoiceConsentDeleted(
        id=consent.id, deleted=True, object="audio.voice_consent")
    for call in (lambda: client.audio.voice_consents.retrieve(consent.id),
                 lambda: client.audio.voice_consents.update(consent.id, name="Back"),
                 lambda: client.audio.voice_consents.delete(consent.id),
                 lambda: clone(client, consent.id, "Again")):
        refused(call, 404, "unknown_consent")
    assert list(client.audio.voice_consents.list()) == []


def test_another_account_gets_404_for_a_consent_and_a_voice_worded_as_for_none(srv):
    alice, bob = sdk(srv, ALICE), sdk(srv, BOB)
    consent = record(alice, "Private")
    voice = clone(alice, consent.id, "Private")
    assert consent.id not in [c.id for c in bob.audio.voice_consents.list()]
    assert voice.id not in cloned_voices(bob)
    for call in (lambda i: bob.audio.voice_consents.retrieve(i), lambda i: bob.audio.voice_consents.update(i, name="x"),
                 lambda i: bob.audio.voice_consents.delete(i), lambda i: clone(bob, i, "Stolen")):
        other = refused(lambda call=call: call(consent.id), 404, "unknown_consent")
        never = refused(lambda call=call: call(NEVER), 404, "unknown_consent")
        assert other.message.replace(consent.id, "ID") == never.message.replace(NEVER, "ID")  # nothing leaks
    for call in (lambda: bob.audio.voices.delete(voice.id), lambda: bob.get(f"/audio/voices/{voice.id}", cast_to=Voice),
                 lambda: bob.audio.speech.create(model="tts-1", voice={"id": voice.id}, input="Mine now.")):
        refused(call, 404, "unknown_voice")
    refused(lambda: bob.audio.voice_consents.list(after=consent.id), 400, "invalid_request")  # not a cursor of bob's
    # untouched for their owner
    assert alice.audio.voice_consents.retrieve(consent.id).name == "Private"
    assert alice.get(f"/audio/voices/{voice.id}", cast_to=Voice).name == "Private"
    assert cloned_voices(bob) == [] and list(bob.audio.voice_consents.list()) == []
    alice.audio.voices.delete(voice.id)
    alice.audio.voice_consents.delete(consent.id)


def test_consents_are_listed_newest_first_in_cursor_pages_and_bounded_per_account(srv):
    client = sdk(srv, CAROL)
    made = [record(client, f"Take {i}", seed=i).id for i in range(4)]
    newest_first = made[::-1]
    first = client.audio.voice_consents.list(limit=3)
    assert [c.id for c in first.data] == newest_first[:3] and first.has_more is True
    rest = client.audio.voice_consents.list(limit=3, after=first.data[-1].id)
    assert [c.id for c in rest.data] == newest_first[3:] and rest.has_more is False
    assert [c.id for c in client.audio.voice_consents.list(limit=1)] == newest_first  # the SDK follows the pages
    raw = requests.get(srv.http + "/v1/audio/voice_consents", params={"limit": 2}, timeout=60,
                       headers={"Authorization": f"Bearer {CAROL}"}).json()
    assert raw["object"] == "list" and raw["first_id"] == newest_first[0] and raw["last_id"] == newest_first[1]
    for limit in (0, 101):
        refused(lambda limit=limit: client.audio.voice_consents.list(limit=limit), 400, "invalid_request")
    refused(lambda: client.audio.voice_consents.list(after=NEVER), 400, "invalid_request")
    refused(lambda: record(client, "One too many"), 409, "too_many_consents")  # voices.max_per_account = 4 here
    for consent_id in made:
        client.audio.voice_consents.delete(consent_id)
    assert list(client.audio.voice_consents.list()) == []


BAD_CONSENTS = [
    ({"recording": ("x.wav", b"GIF89a not audio at all" * 20, "audio/wav")}, 422, "invalid_audio"),
    ({"recording": ("x.wav", wav(1.0), "audio/wav")}, 422, "invalid_audio"),  # too short to say anything
    ({"language": "English please"}, 400, "invalid_request"),
    ({"language": ""}, 400, "invalid_request"),
    ({"name": ""}, 400, "invalid_request"),
    ({"name": "x" * 65}, 400, "invalid_request"),
    ({"name": "bad\u0001name"}, 400, "invalid_request"),
]


@pytest.mark.parametrize("fields, status, code", BAD_CONSENTS, ids=[f"{i}-{c}" for i, (_, _, c) in
                                                                     enumerate(BAD_CONSENTS)])
def test_bad_consent_uploads_get_a_clear_error_and_store_nothing(srv, fields, status, code):
    client = sdk(srv, BOB)
    upload = {"name": "Bad", "language": "en-US", "recording": ("c.wav", wav(), "audio/wav"), **fields}
    refused(lambda: client.audio.voice_consents.create(**upload), status, code)
    assert list(client.audio.voice_consents.list()) == []


def test_bad_voice_requests_get_a_clear_error_and_store_nothing(srv):
    client = sdk(srv, BOB)
    consent = record(client, "Bob")
    sample = ("bo.wav", wav(seed=3), "audio/wav")
    cases = [
        (lambda: client.audio.voices.create(name="Designed", prompt="a warm low voice", type="prompt"), 400,
         "not supported"),
        (lambda: client.audio.voices.create(name="NoWords", consent=consent.id, audio_sample=sample), 400,
         "extra_body"),
        (lambda: clone(client, NEVER, "Unknown"), 404, "no consent recording"),
        (lambda: clone(client, "../../etc/passwd", "Traversal"), 404, "no consent recording that id"),
        (lambda: client.audio.voices.create(name="Noise", consent=consent.id, audio_sample=("x.wav", b"nope" * 100,
                 "audio/wav"), extra_body={"transcript": TRANSCRIPT}), 422, "audio"),
        (lambda: clone(client, consent.id, ""), 400, "'name' is required"),
        (lambda: client.audio.voices.create(name="Mixed", consent=consent.id, audio_sample=sample,
                                            extra_body={"transcript": TRANSCRIPT, "prompt": "warm"}), 400, "prompt"),
        (lambda: client.audio.voices.create(name="Colour", consent=consent.id, audio_sample=sample,
                                            extra_body={"transcript": TRANSCRIPT, "colour": "blue"}), 400,
         "unknown form field 'colour'"),
        (lambda: client.audio.voices.delete("tara"), 400, "built-in"),
        (lambda: client.get("/audio/voices/alloy", cast_to=Voice), 400, "built-in"),
        (lambda: client.audio.voice_consents.update(consent.id, name=""), 400, "name"),
        (lambda: client.audio.voice_consents.update(consent.id, name="Ok", extra_body={"colour": "blue"}), 400,
         "colour"),
    ]
    for call, status, words in cases:
        error = refused(call, status)
        assert words in error.message, error.message
    auth = {"Authorization": f"Bearer {BOB}"}
    url = srv.http + "/v1/audio/voice_consents"
    r = requests.post(url, json={"name": "Bob", "language": "en-US"}, headers=auth, timeout=60)
    assert r.status_code == 400 and "multipart/form-data" in r.json()["error"]["message"]
    r = requests.post(f"{url}/{consent.id}", data="name=x", headers={**auth, "Content-Type": "text/plain"}, timeout=60)
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    for path in ("/v1/audio/voice_consents/%2e%2e", "/v1/audio/voice_consents/cons_abc%00def",
                 "/v1/audio/voices/..%2F..%2Fetc%2Fpasswd", "/v1/audio/voices/v_aaaaaaaaaaaaaaaa%2F.."):
        assert requests.get(srv.http + path, headers=auth, timeout=60).status_code == 404, path
    with pytest.raises(openai.AuthenticationError):
        sdk(srv, "not-a-key").audio.voice_consents.list()
    token = requests.post(srv.http + "/v1/auth/tokens", json={}, headers=auth, timeout=60).json()["token"]
    with pytest.raises(openai.PermissionDeniedError):  # a client token only speaks: these need the API key
        sdk(srv, token).audio.voice_consents.list()
    # nothing was stored, and the consent recording is as it was
    assert [c.model_dump() for c in client.audio.voice_consents.list()] == [consent.model_dump()]
    assert cloned_voices(client) == []
    client.audio.voice_consents.delete(consent.id)
