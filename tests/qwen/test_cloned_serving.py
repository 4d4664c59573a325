"""Cloned voices on a Qwen3-TTS Base checkpoint, served end to end: the Base demo checkpoint
(``lyre checkpoint demo --family qwen3-tts --variant base``) behind a real server. A voice is
enrolled over REST with consent, with a transcript (reference-transcript mode) or without
(x-vector mode), stored as its family needs (the clip's x-vector and 12 Hz codes, as the encoders
make them from the stored clip), spoken by the ``openai`` SDK and gRPC, and deleted with
everything kept of it (the engine's prefix, the codec's warmed-up state)."""

from __future__ import annotations

import asyncio
import io
import json

import numpy as np
import pytest
import requests
import soundfile as sf
from openai import OpenAI

from lyre.codec.qwen12hz.encoder import load_reference_encoder
from lyre.family.qwen3tts.demo import write_demo
from tests.support.audio_files import audio_file, speechlike
from tests.support.servers import serve_in_process
from tests.support.voices import CONSENT, TRANSCRIPT


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo(tmp_path_factory.mktemp("qwen3-base") / "qwen3-tts", variant="base")


@pytest.fixture(scope="module")
def server(demo):
    with serve_in_process(f"model.path={demo}", "codec.path=null", "model.backend=torch", "model.device=cpu",
                          "codec.device=cpu") as srv:
        yield srv


def enroll(server, name: str, transcript: str | None) -> requests.Response:
    data = {"name": name, "consent": json.dumps(CONSENT)} | ({"transcript": transcript} if transcript else {})
    return requests.post(server.http + "/v1/voices", timeout=60, data=data,
                         files={"audio": ("a.wav", audio_file(speechlike(3.5, 16000), 16000, "wav"), "audio/wav")})


def same_audio(a: np.ndarray, b: np.ndarray) -> bool:
    """The same frames decoded: equal length, the same waveform within 1% of its peak (the codec's float
    arithmetic differs a little with how its chunks were cut, which depends on timing). Not a
    correlation: the demo codec's waveform is much the same whatever its frames (other frames of one
    text correlated at 0.9999), but differs by a fifth of its peak somewhere."""
    return len(a) == len(b) and float(np.abs(a - b).max()) <= 0.01 * float(np.abs(a).max())


def speak(server, voice: str, **extra) -> np.ndarray:
    client = OpenAI(base_url=server.http + "/v1", api_key="unused")
    wav = client.audio.speech.create(model="qwen3-tts", voice=voice, input="Hello there. How can I help?",
                                     response_format="wav", extra_body={"seed": 3, **extra}).content
    audio, rate = sf.read(io.BytesIO(wav), dtype="float32")
    assert rate == 24000
    return audio


def on_loop(server, coroutine):
    return asyncio.run_coroutine_threadsafe(coroutine, server._loop).result(60)


def engine_call(server, fn):
    service = server.service
    return on_loop(server, service.on_engine_thread(lambda: fn(service.scheduler)))


def test_a_voice_enrolled_with_its_transcript_speaks_in_reference_transcript_mode(server, demo):
    response = enroll(server, "ann", TRANSCRIPT)
    assert response.status_code == 201, response.text
    voice = response.json()
    service = server.service
    stored = service.voices.registry.get(voice["id"], "default")
    pcm, _ = sf.read(io.BytesIO(service.voices.registry.audio(voice["id"], "default")), dtype="float32")
    # what is stored is what the encoders make of the clip: its 12 Hz frames and its x-vector (of the
    # clip before it was stored as 16-bit FLAC: within that rounding)
    codes = load_reference_encoder(demo / "speech_tokenizer").encode(pcm)
    assert stored.ref_token_ids == tuple(codes.ravel().tolist()) and len(codes) == -(-len(pcm) // 1920)
    xvector = np.frombuffer(stored.speaker_embedding, np.float32)
    assert np.abs(xvector - service.voices.cloning.speaker.embed(pcm)).max() <= 0.02 * np.abs(xvector).max()
    assert stored.transcript == TRANSCRIPT and stored.consent["speaker"] == CONSENT["speaker"]

    audio = speak(server, voice["id"])
    assert len(audio) > 0 and len(audio) % 1920 == 0 and np.abs(audio).max() > 0
    kept = engine_call(server, lambda s: s.engine.kept_prefixes())
    assert any(k.startswith(voice["id"] + ":") for k in kept)  # (its rows, transcript and frames kept by name)
    assert any(k.startswith(voice["id"] + ":") for k in engine_call(server, lambda s: s.audio.codec.warm.keys()))

    assert requests.delete(f"{server.http}/v1/voices/{voice['id']}", timeout=30).status_code in (200, 204)
    assert not any(k.startswith(voice["id"]) for k in engine_call(server, lambda s: s.engine.kept_prefixes()))
    assert not any(k.startswith(voice["id"]) for k in engine_call(server, lambda s: s.audio.codec.warm.keys()))
    gone = requests.post(server.http + "/v1/audio/speech", json={"input": "Hello.", "voice": voice["id"]}, timeout=30)
    assert gone.status_code == 404


def test_a_voice_enrolled_without_a_transcript_speaks_from_its_x_vector(server):
    response = enroll(server, "bob", None)
    assert response.status_code == 201, response.text
    voice = response.json()
    stored = server.service.voices.registry.get(voice["id"], "default")
    assert stored.ref_token_ids == () and stored.transcript == "" and stored.speaker_embedding
    first = speak(server, voice["id"])
    assert len(first) % 1920 == 0 and same_audio(first, speak(server, voice["id"]))  # (seeded)
    other = enroll(server, "cy", TRANSCRIPT).json()["id"]
    assert not same_audio(first, speak(server, other))  # another voice, other audio


@pytest.mark.parametrize(("body", "named"), [
    ({}, "'voice' is required"),
    ({"instructions": "Speak warmly."}, "'instructions' is not taken"),
])
def test_what_a_base_checkpoint_cannot_honour_is_refused_naming_it(server, body, named):
    voice = enroll(server, f"v{len(body)}", None).json()["id"] if body else None
    sent = {"input": "Hello.", **({"voice": voice} if voice else {}), **body}
    response = requests.post(server.http + "/v1/audio/speech", json=sent, timeout=30)
    assert response.status_code == 400 and named in response.json()["error"]["message"]


def test_a_base_checkpoint_has_no_built_in_voice(server):
    body = requests.get(server.http + "/v1/voices", timeout=30).json()
    assert not [v for v in body["voices"] if v["type"] == "builtin"]
    response = requests.post(server.http + "/v1/audio/speech", json={"input": "Hello.", "voice": "vivian"},
                             timeout=30)
    assert response.status_code == 404


def test_a_clip_too_long_for_a_slot_is_refused_with_nothing_stored(server):
    """Reference-transcript mode puts the clip's frames in every prompt: a clip the slot cannot hold
    beside a segment is refused at enrollment, naming the room."""
    voices = server.service.voices
    room, voices.max_reference_tokens = voices.max_reference_tokens, 40  # (a 3.5 s clip is 45 rows)
    try:
        response = enroll(server, "long", TRANSCRIPT)
        assert response.status_code == 422 and "reference" in response.json()["error"]["message"]
        assert enroll(server, "short", None).status_code == 201  # (x-vector mode takes no room)
    finally:
        voices.max_reference_tokens = room
    names = [v["name"] for v in requests.get(server.http + "/v1/voices", timeout=30).json()["voices"]]
    assert "short" in names and "long" not in names


def test_a_voice_deleted_by_another_replica_leaves_nothing_kept_here(server):
    """The sweep finds a voice deleted elsewhere by whatever is kept of it here: the engine's prefix,
    the codec's warmed-up state or the reference prompt (here the prefix is gone already: evicted)."""
    service = server.service
    voice = enroll(server, "dee", TRANSCRIPT).json()["id"]
    speak(server, voice)
    engine_call(server, lambda s: s.engine.forget_prefix(voice + ":"))  # (evicted from the prefix cache)
    assert any(k.startswith(voice) for k in on_loop(server, service._kept_prefixes()))
    service.voices.registry.delete(voice, "default")  # (another replica's deletion: this process is not told)
    on_loop(server, service._sweep_once())
    assert not any(k.startswith(voice) for k in on_loop(server, service._kept_prefixes()))
