"""A Qwen3-TTS VoiceDesign checkpoint served: it has no speakers, so its one built-in voice is the
one its ``instructions`` describe (every OpenAI voice name is an alias of it), and a request without
instructions is a 400 naming the field."""

from __future__ import annotations

import io

import pytest
import soundfile as sf
from openai import BadRequestError, OpenAI

from lyre.family.qwen3tts.demo import write_demo
from tests.support.servers import serve_in_process


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    demo = write_demo(tmp_path_factory.mktemp("qwen3-design") / "design", variant="voice_design")
    with serve_in_process(f"model.path={demo}", "codec.path=null", "model.backend=torch",
                          "model.device=cpu", "codec.device=cpu") as srv:
        yield srv


def test_its_voice_is_the_one_its_instructions_describe(server):
    status, body = server.get("/v1/voices")
    assert status == 200 and [v["id"] for v in body["voices"]] == ["design"] and body["default"] == "design"
    client = OpenAI(base_url=server.http + "/v1", api_key="unused")
    wav = client.audio.speech.create(model="qwen3-tts", voice="alloy", input="Good evening.", response_format="wav",
                                     instructions="A calm, low voice, speaking slowly.",
                                     extra_body={"seed": 1}).content
    audio, rate = sf.read(io.BytesIO(wav), dtype="float32")
    assert rate == 24000 and len(audio) > 0 and len(audio) % 1920 == 0
    with pytest.raises(BadRequestError, match="'instructions' is required"):
        client.audio.speech.create(model="qwen3-tts", voice="design", input="Good evening.")


def test_riva_clients_describe_the_voice_in_custom_configuration(server):
    """Riva's request has no field for a voice description: ``custom_configuration`` carries it."""
    import grpc
    import numpy as np
    from riva.client.proto import riva_tts_pb2, riva_tts_pb2_grpc

    def say(**custom) -> bytes:
        return stub.Synthesize(riva_tts_pb2.SynthesizeSpeechRequest(
            text="Good evening.", encoding=1, sample_rate_hz=24000, custom_configuration={"seed": "2", **custom})).audio

    with grpc.insecure_channel(server.grpc) as channel:
        stub = riva_tts_pb2_grpc.RivaSpeechSynthesisStub(channel)
        calm, bright = say(instructions="A calm, low voice."), say(instructions="A bright, quick voice.")
        assert len(calm) > 0 and len(calm) % (2 * 1920) == 0
        x, y = (np.frombuffer(a, "<i2") for a in (calm, bright))
        assert len(x) != len(y) or np.abs(x.astype(int) - y).max() > 2  # another description, another voice
        with pytest.raises(grpc.RpcError) as e:
            say()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'instructions' is required" in e.value.details()
