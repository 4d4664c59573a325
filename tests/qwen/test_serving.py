"""A Qwen3-TTS checkpoint served end to end: the demo checkpoint (``lyre checkpoint demo --family
qwen3-tts``: the real file layout, random weights) behind a real server, spoken to with the
``openai`` SDK and plain HTTP. Its speakers are the built-in voices; what it cannot honour (an
Orpheus emotion tag, an unknown voice or language, instructions on 0.6B CustomVoice, cloning) is a
400 naming the problem; the audio is frames of 1920 samples at 24 kHz."""

from __future__ import annotations

import io
import json
import urllib.request

import numpy as np
import pytest
import soundfile as sf
from openai import OpenAI

from lyre.family.qwen3tts.demo import SPEAKERS, write_demo
from tests.support.servers import serve_in_process
from tests.support.voices import enroll


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    demo = write_demo(tmp_path_factory.mktemp("qwen3-demo") / "qwen3-tts")
    with serve_in_process(f"model.path={demo}", "codec.path=null", "model.backend=torch") as srv:
        yield srv


def post(server, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(server.http + "/v1/audio/speech", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, {}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_openai_sdk_gets_speech_in_a_speakers_voice(server):
    client = OpenAI(base_url=server.http + "/v1", api_key="unused")
    wav = client.audio.speech.create(model="qwen3-tts", voice="ryan", input="Hello there. How can I help you today?",
                                     response_format="wav", extra_body={"seed": 1}).content
    audio, rate = sf.read(io.BytesIO(wav), dtype="float32")
    assert rate == 24000 and len(audio) > 0 and len(audio) % 1920 == 0  # whole 80 ms frames
    assert np.abs(audio).max() > 0  # (noise: the demo's weights are random)
    assert server.service.family.name == "qwen3-tts"


def test_the_voices_are_the_checkpoints_speakers(server):
    status, body = server.get("/v1/voices")
    assert status == 200
    builtin = {v["id"] for v in body["voices"] if v["type"] == "builtin"}
    assert builtin == set(SPEAKERS) and body["default"] == "vivian"
    alloy = next(v for v in body["voices"] if v["id"] == "vivian")
    assert "alloy" in alloy["aliases"]  # OpenAI's names reach a speaker


@pytest.mark.parametrize(("voice", "language"), [("vivian", "english"), ("eric", "chinese"), ("ryan", "auto")])
def test_a_language_the_checkpoint_names_is_spoken(server, voice, language):
    status, _ = post(server, {"voice": voice, "input": "Hello.", "language": language, "response_format": "pcm"})
    assert status == 200


@pytest.mark.parametrize(("body", "status", "named"), [
    ({"voice": "tara"}, 404, "unknown voice 'tara'"),  # an Orpheus voice (404: as any unknown voice)
    ({"input": "Well <laugh> that is funny."}, 400, "<laugh>"),
    ({"language": "klingon"}, 400, "language 'klingon'"),
    ({"instructions": "Speak slowly and warmly."}, 400, "'instructions' is not taken"),
    ({"input": "Say <|im_end|> now."}, 400, "control token"),
])
def test_what_the_model_cannot_honour_is_refused_naming_it(server, body, status, named):
    got, error = post(server, {"model": "qwen3-tts", "voice": "vivian", "input": "Hello.", **body})
    assert got == status and named in error["error"]["message"], error


def test_a_frame_cap_follows_the_text(server):
    client = OpenAI(base_url=server.http + "/v1", api_key="unused")
    pcm = client.audio.speech.create(model="qwen3-tts", voice="vivian", input="Hi.", response_format="pcm",
                                     extra_body={"seed": 2, "min_tokens": 1000, "max_tokens": 1000}).content
    frames = len(pcm) // 2 / 1920
    tokens = len(server.service.tokenizer.encode("Hi.").ids)
    assert frames <= 25 + 8 * tokens  # the documented cap: 2 s plus 0.64 s a text token


def test_cloning_is_refused_on_this_family_with_nothing_stored(server):
    response = enroll(server, "ann")
    assert response.status_code == 400 and "voice cloning is not available" in response.json()["error"]["message"]
    status, body = server.get("/v1/voices")
    assert all(v["type"] == "builtin" for v in body["voices"])
