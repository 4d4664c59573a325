"""A Qwen3-TTS checkpoint served end to end: the demo checkpoint (``lyre checkpoint demo --family
qwen3-tts``: the real file layout, random weights) behind a real server, spoken to with the
``openai`` SDK and plain HTTP. Its speakers are the built-in voices; what it cannot honour (an
Orpheus emotion tag, an unknown voice or language, instructions on 0.6B CustomVoice, cloning) is a
400 naming the problem; the audio is frames of 1920 samples at 24 kHz."""

from __future__ import annotations

import asyncio
import io
import json
import urllib.request

import grpc
import numpy as np
import pytest
import soundfile as sf
import websockets
from openai import OpenAI

from lyre.core.stats import STOP_REASONS
from lyre.family.qwen3tts.demo import SPEAKERS, write_demo
from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import serve_in_process
from tests.support.voices import enroll


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    demo = write_demo(tmp_path_factory.mktemp("qwen3-demo") / "qwen3-tts")
    with serve_in_process(f"model.path={demo}", "codec.path=null", "model.backend=torch",
                          "model.device=cpu", "codec.device=cpu") as srv:
        yield srv


STOPS = set(STOP_REASONS.values())


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


def pcm(server, body: dict) -> bytes:
    req = urllib.request.Request(server.http + "/v1/audio/speech", json.dumps(
        {"input": "Hello there.", "response_format": "pcm", "seed": 5, **body}).encode(),
        {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()


def same_audio(a: bytes, b: bytes) -> bool:
    """The same seeded frames, decoded perhaps in other chunks (the codec's batches follow the
    listener's pace): equal to the last bit or two of 16."""
    x, y = np.frombuffer(a, "<i2").astype(int), np.frombuffer(b, "<i2").astype(int)
    return len(x) == len(y) and np.abs(x - y).max(initial=0) <= 2


def test_the_language_asked_for_is_the_one_spoken(server):
    english, german = (pcm(server, {"voice": "ryan", "language": lang}) for lang in ("english", "german"))
    assert same_audio(english, pcm(server, {"voice": "ryan", "language": "english"}))  # (seeded: the same again)
    assert not same_audio(english, german)  # another language's prompt row: other audio


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


def test_a_frame_cap_follows_the_text_and_the_final_message_says_it_stopped_there(server):
    async def speak() -> tuple[bytes, dict]:
        async with websockets.connect(server.http.replace("http", "ws") + "/v1/audio/stream") as ws:
            # (end of speech held back to the end: the cap alone stops it)
            await ws.send(json.dumps({"text": "Hi.", "voice": "vivian", "seed": 2, "min_tokens": 1000,
                                      "max_tokens": 1000}))
            pcm = b""
            while isinstance(message := await ws.recv(), bytes):
                pcm += message
            return pcm, json.loads(message)

    pcm, done = asyncio.run(speak())
    tokens = len(server.service.tokenizer.encode("Hi.").ids)
    assert len(pcm) // 2 == (25 + 8 * tokens) * 1920  # the documented cap: 2 s plus 0.64 s a text token
    assert done["done"] and done["metrics"]["stop_reason"] == "length"


def test_cloning_is_refused_on_this_family_with_nothing_stored(server):
    response = enroll(server, "ann")
    assert response.status_code == 400 and "voice cloning is not available" in response.json()["error"]["message"]
    status, body = server.get("/v1/voices")
    assert all(v["type"] == "builtin" for v in body["voices"])


def test_websocket_and_grpc_take_language_and_instructions_too(server):
    async def ws(message: dict) -> dict:
        async with websockets.connect(server.http.replace("http", "ws") + "/v1/audio/stream") as sock:
            await sock.send(json.dumps({"voice": "vivian", "text": "Hello.", "seed": 4, **message}))
            while isinstance(reply := await sock.recv(), bytes):
                pass
            return json.loads(reply)

    assert asyncio.run(ws({"language": "german"}))["done"]
    assert asyncio.run(ws({"language": "klingon"}))["error"]["message"].startswith("language 'klingon'")
    refused = asyncio.run(ws({"instructions": "Speak warmly."}))
    assert "'instructions' is not taken" in refused["error"]["message"]

    with grpc.insecure_channel(server.grpc) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        reply = stub.Synthesize(tts_pb2.SynthesizeRequest(text="Hello.", voice="ryan", language="english"))
        assert len(reply.audio) % (2 * 1920) == 0 and reply.metrics.stop_reason in STOPS
        with pytest.raises(grpc.RpcError) as e:
            stub.Synthesize(tts_pb2.SynthesizeRequest(text="Hello.", voice="ryan", language="klingon"))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "klingon" in e.value.details()
        config = tts_pb2.StreamingConfig(voice="sohee", instructions="Whisper.")
        with pytest.raises(grpc.RpcError) as e:
            list(stub.StreamingSynthesize(iter([tts_pb2.StreamingSynthesizeRequest(config=config),
                                                tts_pb2.StreamingSynthesizeRequest(text="Hello.")])))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "instructions" in e.value.details()


def test_the_torch_12hz_codec_decodes_on_the_engine_thread_unless_asked_otherwise(server):
    # (codec.overlap auto hands a CPU runtime of its own, onnxruntime, a thread; the 12 Hz codec runs on
    # torch, whose decode would only wait a step for the engine's on another thread: every chunk a step later)
    from lyre.service.runtime import cpu_split

    assert server.service.scheduler.audio._overlap is None
    cfg = server.service.config
    assert not cpu_split(cfg, "cpu", codec_runtime="torch").overlap
    on = cfg.model_copy(update={"codec": cfg.codec.model_copy(update={"overlap": "on"})})
    assert cpu_split(on, "cpu", codec_runtime="torch").overlap


def test_riva_clients_name_the_language_by_its_code(server):
    from riva.client.proto import riva_tts_pb2, riva_tts_pb2_grpc

    with grpc.insecure_channel(server.grpc) as channel:
        stub = riva_tts_pb2_grpc.RivaSpeechSynthesisStub(channel)
        said = {}
        for code in ("en-US", "zh-CN", "en-GB"):
            reply = stub.Synthesize(riva_tts_pb2.SynthesizeSpeechRequest(
                text="Hello.", voice_name="English-US.Female-1", language_code=code, encoding=1,
                sample_rate_hz=24000, custom_configuration={"seed": "3"}))
            assert len(reply.audio) > 0 and len(reply.audio) % (2 * 1920) == 0
            said[code] = reply.audio
        # the language its code names is spoken
        assert same_audio(said["en-US"], said["en-GB"]) and not same_audio(said["en-US"], said["zh-CN"])
        with pytest.raises(grpc.RpcError) as e:
            stub.Synthesize(riva_tts_pb2.SynthesizeSpeechRequest(text="Hello.", language_code="tlh-KL", encoding=1,
                                                                 sample_rate_hz=24000))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "en (english)" in e.value.details()


def test_a_built_in_voices_kept_prefix_outlives_the_sweep_for_deleted_voices(server):
    status, _ = post(server, {"voice": "sohee", "input": "Hello.", "response_format": "pcm"})
    assert status == 200
    service = server.service

    def on_loop(coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, server._loop).result(60)

    kept = on_loop(service.on_engine_thread(lambda: service.scheduler.engine.kept_prefixes()))
    assert kept and all(k.startswith("rows:") for k in kept)  # (its instructions, role and voice rows)
    on_loop(service._sweep_once())  # (cloned voices deleted elsewhere are swept: a built-in voice is none)
    assert on_loop(service.on_engine_thread(lambda: service.scheduler.engine.kept_prefixes())) == kept
