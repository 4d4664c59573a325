"""Cloned voices over REST (multipart through aiohttp), WebSocket and gRPC against the real server:
enroll, list, use, delete; accounts see only their own voices on every surface; bad uploads get
a clear 4xx and store nothing."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import grpc
import pytest
import websockets
from openai import OpenAI
from riva.client.proto import riva_tts_pb2, riva_tts_pb2_grpc

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.audio_files import audio_file, speechlike
from tests.support.servers import MAX_TOKENS, serve_in_process
from tests.support.voices import CONSENT, TRANSCRIPT

ALICE, BOB = "key-alice-0123456789", "key-bob-9876543210"
PCM_BYTES = MAX_TOKENS // 7 * 2048 * 2


@pytest.fixture(scope="module")
def srv():
    with serve_in_process(f"server.api_keys={{{ALICE}: alice, {BOB}: bob}}", "voices.max_upload_bytes=400000",
                          "voices.max_per_account=3") as s:
        yield s
        assert s.stop() == 0


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def clip(seconds: float = 4.0, rate: int = 16000, fmt: str = "wav", seed: int = 0) -> bytes:
    return audio_file(speechlike(seconds, rate, 1, seed=seed), rate, fmt)


def form(audio: bytes | None = None, transcript: str | None = TRANSCRIPT, name: str | None = "Ann",
         consent: object = CONSENT, filename: str = "ann.wav") -> aiohttp.FormData:
    f = aiohttp.FormData(default_to_multipart=True)
    if audio is not None:
        f.add_field("audio", audio, filename=filename, content_type="audio/wav")
    if transcript is not None:
        f.add_field("transcript", transcript)
    if name is not None:
        f.add_field("name", name)
    if consent is not None:
        f.add_field("consent", consent if isinstance(consent, str) else json.dumps(consent))
    return f


async def call(method: str, url: str, key: str, **kwargs) -> tuple[int, dict | bytes]:
    async with aiohttp.ClientSession() as s, s.request(method, url, headers=auth(key), **kwargs) as r:
        body = await r.read()
        if r.content_type == "application/json":
            return r.status, json.loads(body)
        return r.status, body


def run(coro):
    return asyncio.run(coro)


async def enroll(srv, key: str = ALICE, **fields) -> tuple[int, dict]:
    fields.setdefault("audio", clip())
    return await call("POST", srv.http + "/v1/voices", key, data=form(**fields))


async def ws_speak(srv, key: str, voice: str) -> tuple[int, dict]:
    url = srv.http.replace("http://", "ws://") + "/v1/audio/stream"
    got = 0
    async with websockets.connect(url, additional_headers=auth(key)) as ws:
        await ws.send(json.dumps({"text": "Over the socket.", "voice": voice}))
        async for message in ws:
            if isinstance(message, bytes):
                got += len(message)
            else:
                return got, json.loads(message)
    raise AssertionError("the socket closed without a last message")


def grpc_calls(srv, key: str, voice: str) -> dict[str, grpc.StatusCode | int]:
    """Every gRPC call that takes a voice, with ``voice``: the audio bytes it got or its status."""
    metadata = (("authorization", f"Bearer {key}"),)
    out: dict[str, grpc.StatusCode | int] = {}
    with grpc.insecure_channel(srv.grpc) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        riva = riva_tts_pb2_grpc.RivaSpeechSynthesisStub(channel)
        calls = {
            "Synthesize": lambda: len(stub.Synthesize(tts_pb2.SynthesizeRequest(text="By gRPC.", voice=voice),
                                                      metadata=metadata).audio),
            "SynthesizeStream": lambda: sum(len(c.audio) for c in stub.SynthesizeStream(
                tts_pb2.SynthesizeRequest(text="By gRPC.", voice=voice), metadata=metadata)),
            "StreamingSynthesize": lambda: sum(len(c.audio) for c in stub.StreamingSynthesize(iter([
                tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.StreamingConfig(voice=voice)),
                tts_pb2.StreamingSynthesizeRequest(text="By gRPC.")]), metadata=metadata)),
            "GetVoice": lambda: len(stub.GetVoice(tts_pb2.GetVoiceRequest(id=voice), metadata=metadata).id),
            "RivaSynthesize": lambda: len(riva.Synthesize(riva_tts_pb2.SynthesizeSpeechRequest(
                text="By Riva.", voice_name=voice, encoding=1, sample_rate_hz=24000), metadata=metadata).audio),
        }
        for name, fn in calls.items():
            try:
                out[name] = fn()
            except grpc.RpcError as e:
                out[name] = e.code()
    return out


def test_a_voice_is_enrolled_used_everywhere_and_deleted(srv):
    status, v = run(enroll(srv))
    assert status == 201 and v["id"].startswith("v_") and v["type"] == "cloned" and v["name"] == "Ann"
    assert v["transcript"] == TRANSCRIPT and abs(v["duration_s"] - 4.0) < 0.01 and v["reference_tokens"] == 7 * 47
    vid = v["id"]
    status, listing = run(call("GET", srv.http + "/v1/voices", ALICE))
    ids = [x["id"] for x in listing["voices"]]
    assert status == 200 and ids[:8] == ["tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"] and vid in ids
    assert run(call("GET", srv.http + f"/v1/voices/{vid}", ALICE)) == (200, v)
    status, consent = run(call("GET", srv.http + f"/v1/voices/{vid}/consent", ALICE))
    assert status == 200 and consent["consent"]["speaker"] == "Ann Example"
    assert consent["consent"]["account"] == "alice" and consent["consent"]["address"] == "127.0.0.1"

    client = OpenAI(base_url=srv.http + "/v1", api_key=ALICE)
    pcm = client.audio.speech.create(model="tts-1", voice=vid, input="Hello, in my own voice.",
                                     response_format="pcm").content
    assert len(pcm) == PCM_BYTES
    as_openai = client.audio.speech.create(model="tts-1", voice={"id": vid}, input="Hello, in my own voice.",
                                           response_format="pcm").content  # OpenAI's form of a custom voice
    assert len(as_openai) == PCM_BYTES
    got, done = run(ws_speak(srv, ALICE, vid))
    assert got == PCM_BYTES and done["done"] is True
    assert grpc_calls(srv, ALICE, vid) == {"Synthesize": PCM_BYTES, "SynthesizeStream": PCM_BYTES,
                                           "StreamingSynthesize": PCM_BYTES, "GetVoice": len(vid),
                                           "RivaSynthesize": PCM_BYTES}

    assert run(call("DELETE", srv.http + f"/v1/voices/{vid}", ALICE)) == (204, b"")
    status, error = run(call("POST", srv.http + "/v1/audio/speech", ALICE, json={"input": "gone", "voice": vid}))
    assert status == 404 and error["error"]["code"] == "unknown_voice"
    assert run(call("GET", srv.http + f"/v1/voices/{vid}", ALICE))[0] == 404
    assert run(call("DELETE", srv.http + f"/v1/voices/{vid}", ALICE))[0] == 404
    got, error = run(ws_speak(srv, ALICE, vid))
    assert got == 0 and error["error"]["code"] == "unknown_voice"
    assert set(grpc_calls(srv, ALICE, vid).values()) == {grpc.StatusCode.NOT_FOUND}
    assert vid not in [x["id"] for x in run(call("GET", srv.http + "/v1/voices", ALICE))[1]["voices"]]


def test_another_account_gets_404_for_a_voice_on_every_endpoint_and_protocol(srv):
    status, v = run(enroll(srv, name="Private"))
    assert status == 201
    vid = v["id"]
    for method, path in (("GET", f"/v1/voices/{vid}"), ("GET", f"/v1/voices/{vid}/consent"),
                         ("DELETE", f"/v1/voices/{vid}")):
        status, error = run(call(method, srv.http + path, BOB))
        assert status == 404 and error["error"]["code"] == "unknown_voice", path
    status, error = run(call("POST", srv.http + "/v1/audio/speech", BOB, json={"input": "mine now", "voice": vid}))
    assert status == 404
    # worded exactly as for a voice that never existed: existence does not leak
    _, never = run(call("GET", srv.http + "/v1/voices/v_AAAAAAAAAAAAAAAA", BOB))
    assert error["error"]["message"].replace(vid, "ID") == never["error"]["message"].replace("v_AAAAAAAAAAAAAAAA", "ID")
    assert vid not in [x["id"] for x in run(call("GET", srv.http + "/v1/voices", BOB))[1]["voices"]]
    got, error = run(ws_speak(srv, BOB, vid))
    assert got == 0 and error["error"]["code"] == "unknown_voice"
    assert set(grpc_calls(srv, BOB, vid).values()) == {grpc.StatusCode.NOT_FOUND}
    with grpc.insecure_channel(srv.grpc) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(id=vid), metadata=(("authorization", f"Bearer {BOB}"),))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        listed = stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=(("authorization", f"Bearer {BOB}"),))
        assert vid not in [x.id for x in listed.voices]
    assert run(call("GET", srv.http + f"/v1/voices/{vid}", ALICE))[0] == 200  # still there for its owner
    assert run(call("DELETE", srv.http + f"/v1/voices/{vid}", ALICE))[0] == 204


def test_enrollment_over_grpc(srv):
    metadata = (("authorization", f"Bearer {BOB}"),)
    with grpc.insecure_channel(srv.grpc) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        request = tts_pb2.EnrollVoiceRequest(audio=clip(9.0), transcript=TRANSCRIPT, name="Bo",
                                             consent=tts_pb2.Consent(granted=True, speaker="Bo", source="self_recorded"))
        assert len(request.SerializeToString()) > 262144  # over server.max_body_bytes: an audio file's limit applies
        v = stub.EnrollVoice(request, metadata=metadata)
        assert v.id.startswith("v_") and v.type == "cloned" and abs(v.duration_s - 9.0) < 0.01
        detail = stub.GetVoice(tts_pb2.GetVoiceRequest(id=v.id), metadata=metadata)
        assert detail.consent.speaker == "Bo" and detail.consent.account == "bob" and detail.consent.upload_sha256
        listed = stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=metadata)
        assert [x.type for x in listed.voices].count("builtin") == 8 and v.id in [x.id for x in listed.voices]
        for bad, code in [(tts_pb2.EnrollVoiceRequest(audio=clip(), transcript=TRANSCRIPT, name="NoConsent"),
                           grpc.StatusCode.INVALID_ARGUMENT),
                          (request, grpc.StatusCode.ALREADY_EXISTS)]:
            with pytest.raises(grpc.RpcError) as e:
                stub.EnrollVoice(bad, metadata=metadata)
            assert e.value.code() == code
        stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(id=v.id), metadata=metadata)
        with pytest.raises(grpc.RpcError) as e:
            stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(id="tara"), metadata=metadata)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


BAD_ENROLLMENTS = [
    ({"audio": b"GIF89a not audio at all" * 20}, 422, "invalid_audio"),
    ({"audio": audio_file(speechlike(5.0, 16000) * 0, 16000, "wav")}, 422, "invalid_audio"),  # silence
    ({"audio": audio_file((speechlike(5.0, 16000) > 0) * 2.0 - 1.0, 16000, "wav")}, 422, "invalid_audio"),  # clipping
    ({"audio": clip(2.0)}, 422, "invalid_audio"),
    ({"audio": clip(31.0, rate=8000, fmt="flac")}, 422, "invalid_audio"),
    ({"audio": clip(13.0, rate=16000)}, 413, "upload_too_large"),  # 416 kB > voices.max_upload_bytes here
    ({"transcript": ""}, 400, "invalid_request"),
    ({"transcript": "far too many words for four seconds " * 10}, 400, "invalid_request"),
    ({"name": "bad\u0001name"}, 400, "invalid_request"),
    ({"name": None}, 400, "invalid_request"),
    ({"consent": None}, 422, "consent_required"),
    ({"consent": {**CONSENT, "granted": False}}, 422, "consent_required"),
    ({"consent": "not json"}, 400, "invalid_request"),
]


@pytest.mark.parametrize("fields, status, code", BAD_ENROLLMENTS, ids=[f"{i}-{c}" for i, (_, _, c) in
                                                                        enumerate(BAD_ENROLLMENTS)])
def test_bad_enrollments_get_a_clear_error_and_store_nothing(srv, fields, status, code):
    got, error = run(enroll(srv, key=BOB, **{"name": "Bad", **fields}))
    assert got == status and error["error"]["code"] == code, error
    assert len(error["error"]["message"]) < 400
    assert [x for x in run(call("GET", srv.http + "/v1/voices", BOB))[1]["voices"] if x["type"] == "cloned"] == []


def test_bad_requests_around_enrollment(srv):
    async def go():
        async with aiohttp.ClientSession(headers=auth(BOB)) as s:
            async with s.post(srv.http + "/v1/voices", json={"audio": "base64..."}) as r:
                not_multipart = r.status, (await r.json())["error"]["message"]
            f = form(audio=clip())
            f.add_field("colour", "blue")
            async with s.post(srv.http + "/v1/voices", data=f) as r:
                unknown = r.status, (await r.json())["error"]["message"]
            async with s.post(srv.http + "/v1/voices", data=form(audio=None)) as r:
                no_audio = r.status, (await r.json())["error"]["message"]
            return not_multipart, unknown, no_audio

    not_multipart, unknown, no_audio = run(go())
    assert not_multipart[0] == 400 and "multipart/form-data" in not_multipart[1]
    assert unknown[0] == 400 and "unknown form field 'colour'" in unknown[1]
    assert no_audio[0] == 400 and "'audio'" in no_audio[1]
    for path in ("/v1/voices/..%2F..%2Fetc%2Fpasswd", "/v1/voices/%2e%2e", "/v1/voices/v_abc%00def",
                 "/v1/voices/v_aaaaaaaaaaaaaaaa%2F..", "/v1/voices/%2e%2e/consent"):
        status, body = run(call("GET", srv.http + path, BOB))
        assert status == 404, path
    assert run(call("DELETE", srv.http + "/v1/voices/tara", BOB))[0] == 400  # built-in voices stay
    assert run(call("GET", srv.http + "/v1/voices/ash", BOB))[1]["id"] == "leo"  # an alias names its voice


def test_two_concurrent_enrollments_with_one_name_one_wins_and_the_account_limit_holds(srv):
    async def twice():
        return await asyncio.gather(enroll(srv, key=BOB, name="Twin", audio=clip(seed=1)),
                                    enroll(srv, key=BOB, name="Twin", audio=clip(seed=2)))

    results = run(twice())
    assert sorted(status for status, _ in results) == [201, 409]
    assert [e for s, e in results if s == 409][0]["error"]["code"] == "voice_exists"
    assert run(enroll(srv, key=BOB, name="Two"))[0] == 201
    assert run(enroll(srv, key=BOB, name="Three"))[0] == 201
    status, error = run(enroll(srv, key=BOB, name="Four"))  # voices.max_per_account = 3 here
    assert status == 409 and error["error"]["code"] == "too_many_voices"
    for v in run(call("GET", srv.http + "/v1/voices", BOB))[1]["voices"]:
        if v["type"] == "cloned":
            assert run(call("DELETE", srv.http + f"/v1/voices/{v['id']}", BOB))[0] == 204
