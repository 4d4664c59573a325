"""NVIDIA's Riva TTS API with NVIDIA's own client (``nvidia-riva-client``): a stack built on
``riva.client.SpeechSynthesisService`` works against Lyre by changing only its URI."""

from __future__ import annotations

import io

import av
import grpc
import numpy as np
import pytest
import riva.client
import soundfile
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from riva.client.proto import riva_common_pb2, riva_tts_pb2, riva_tts_pb2_grpc

from tests.support.servers import MAX_TOKENS, same_speech, serve_in_process

SAMPLES = MAX_TOKENS // 7 * 2048  # per request at 24 kHz
AudioEncoding = riva.client.AudioEncoding


@pytest.fixture(scope="module")
def tts(server):
    return riva.client.SpeechSynthesisService(riva.client.Auth(uri=server.grpc))


def samples_at(rate: int) -> int:
    return round(SAMPLES * rate / 24000)


def decoded(data: bytes) -> tuple[np.ndarray, int]:
    """Audio in a container, decoded by FFmpeg (PyAV): mono float samples and their rate."""
    with av.open(io.BytesIO(data)) as f:
        frames = [frame.to_ndarray().reshape(-1) for frame in f.decode(audio=0)]
        return np.concatenate(frames), f.streams.audio[0].codec_context.sample_rate


@pytest.mark.parametrize("rate", [22050, 16000, 8000])
def test_synthesize_linear_pcm_at_the_clients_rates(tts, rate):
    resp = tts.synthesize("Hello from Riva.", voice_name="English-US.Female-1", sample_rate_hz=rate)
    pcm = np.frombuffer(resp.audio, dtype=np.int16)  # raw s16le, as Riva sends it
    assert abs(len(pcm) - samples_at(rate)) <= 2
    assert np.abs(pcm).max() > 0
    assert resp.meta.text == "Hello from Riva."


def test_every_riva_encoding_decodes(tts):
    """The client's default rate is 22050 Hz: every encoding gives audio of the request's length."""
    out = {enc: tts.synthesize("Every encoding.", encoding=enc, custom_configuration={"seed": "5"}).audio
           for enc in (AudioEncoding.LINEAR_PCM, AudioEncoding.FLAC, AudioEncoding.MULAW, AudioEncoding.OGGOPUS,
                       AudioEncoding.ALAW)}
    assert abs(len(out[AudioEncoding.LINEAR_PCM]) // 2 - samples_at(22050)) <= 2
    assert abs(len(out[AudioEncoding.MULAW]) - samples_at(22050)) <= 2  # one byte a sample
    assert abs(len(out[AudioEncoding.ALAW]) - samples_at(22050)) <= 2
    flac, flac_rate = soundfile.read(io.BytesIO(out[AudioEncoding.FLAC]), dtype="int16")  # libsndfile reads it
    assert flac_rate == 22050
    assert same_speech(flac.tobytes(), out[AudioEncoding.LINEAR_PCM])  # lossless, same tokens
    opus, opus_rate = decoded(out[AudioEncoding.OGGOPUS])
    assert opus_rate == 48000 and abs(len(opus) / opus_rate - SAMPLES / 24000) < 0.03
    assert out[AudioEncoding.OGGOPUS][:4] == b"OggS"


def test_synthesize_online_streams_what_synthesize_gives(tts):
    # 8 frames, more than one chunk may hold (codec.max_chunk_frames is 4), however the server's pace
    # groups them: a whole 4-frame answer may go out as one chunk when the codec catches up with it
    seed = {"seed": "7", "temperature": "0.8", "max_tokens": "56", "min_tokens": "56"}
    whole = tts.synthesize("Same words.", sample_rate_hz=24000, custom_configuration=seed).audio
    chunks = list(tts.synthesize_online("Same words.", sample_rate_hz=24000, custom_configuration=seed))
    assert len(chunks) >= 2  # streamed as decoded, not in one piece
    assert same_speech(b"".join(c.audio for c in chunks), whole)
    assert {c.meta.text for c in chunks} == {"Same words."}


def test_synthesize_online_speaks_each_streamed_text_in_order(tts):
    chunks = list(tts.synthesize_online(["First sentence.", "Second sentence."], encoding=AudioEncoding.MULAW,
                                        sample_rate_hz=8000))
    texts = [c.meta.text for c in chunks]
    assert texts[0] == "First sentence." and texts[-1] == "Second sentence."
    assert texts == sorted(texts, key=["First sentence.", "Second sentence."].index)
    assert abs(len(b"".join(c.audio for c in chunks)) - 2 * samples_at(8000)) <= 4


def test_riva_voice_names_map_to_lyre_voices(tts):
    seed = {"seed": "3"}
    riva_name = tts.synthesize("Who is this?", voice_name="English-US.Female-1", sample_rate_hz=24000,
                               custom_configuration=seed).audio
    lyre_name = tts.synthesize("Who is this?", voice_name="tara", sample_rate_hz=24000, custom_configuration=seed).audio
    other = tts.synthesize("Who is this?", voice_name="english-us.male-1", sample_rate_hz=24000,
                           custom_configuration=seed).audio
    assert same_speech(riva_name, lyre_name)
    assert not same_speech(riva_name, other)  # Male-1 is leo


def test_voices_are_listed_the_way_riva_lists_them(tts):
    """As Riva's own ``talk.py --list-voices`` reads them: ``<voice_name>.<subvoice>``; each one speaks."""
    config = tts.stub.GetRivaSynthesisConfig(riva_tts_pb2.RivaSynthesisConfigRequest())
    (model,) = config.model_config
    assert model.parameters["language_code"] == "en-US"
    names = [f"{model.parameters['voice_name']}.{sub.split(':')[0]}" for sub in model.parameters["subvoices"].split(",")]
    assert "English-US.Female-1" in names and "English-US.Male-3" in names and len(names) == 8
    assert model.parameters["lyre_voices"].split(",")[0] == "tara"
    assert len(tts.synthesize("Listed.", voice_name=names[-1]).audio) > 0
    with pytest.raises(grpc.RpcError) as e:
        tts.stub.GetRivaSynthesisConfig(riva_tts_pb2.RivaSynthesisConfigRequest(model_name="fastpitch"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_request_id_is_echoed(server):
    with grpc.insecure_channel(server.grpc) as channel:
        stub = riva_tts_pb2_grpc.RivaSpeechSynthesisStub(channel)
        request = riva_tts_pb2.SynthesizeSpeechRequest(text="Echo.", sample_rate_hz=8000,
                                                       id=riva_common_pb2.RequestId(value="call-42"))
        assert stub.Synthesize(request).id.value == "call-42"
        assert {r.id.value for r in stub.SynthesizeOnline(iter([request]))} == {"call-42"}


@pytest.mark.parametrize("kwargs, code, words", [
    ({"voice_name": "English-US.Female-9"}, grpc.StatusCode.NOT_FOUND, "English-US.Female-1"),
    ({"text": ""}, grpc.StatusCode.INVALID_ARGUMENT, "empty"),
    ({"text": "   "}, grpc.StatusCode.INVALID_ARGUMENT, "empty"),
    ({"language_code": "de-DE"}, grpc.StatusCode.INVALID_ARGUMENT, "en-US"),
    ({"custom_dictionary": {"Lyre": "L AY1 ER0"}}, grpc.StatusCode.INVALID_ARGUMENT, "custom_dictionary"),
    ({"custom_configuration": {"exaggeration": "2"}}, grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
    ({"custom_configuration": {"temperature": "hot"}}, grpc.StatusCode.INVALID_ARGUMENT, "a number"),
    ({"custom_configuration": {"temperature": "9"}}, grpc.StatusCode.INVALID_ARGUMENT, "out of range"),
    ({"sample_rate_hz": 4000}, grpc.StatusCode.INVALID_ARGUMENT, "8000"),
    ({"encoding": 7}, grpc.StatusCode.INVALID_ARGUMENT, "OGGOPUS"),
    ({"text": "word " * 60_000}, grpc.StatusCode.INVALID_ARGUMENT, "(server.max_body_bytes)"),  # 300 kB
])
def test_bad_requests_get_riva_status_codes_on_both_calls(tts, server, kwargs, code, words):
    kwargs = {"text": "Fine text.", **kwargs}
    text = kwargs.pop("text")
    for call in (tts.synthesize, lambda *a, **k: list(tts.synthesize_online(*a, **k))):
        with pytest.raises(grpc.RpcError) as e:
            call(text, **kwargs)
        assert e.value.code() == code and words in e.value.details(), e.value.details()
    assert server.eventually_idle()["kv_cache"]["used_slots"] == 0


def test_zero_shot_data_is_refused_for_want_of_a_consent_record(server):
    with grpc.insecure_channel(server.grpc) as channel:
        stub = riva_tts_pb2_grpc.RivaSpeechSynthesisStub(channel)
        request = riva_tts_pb2.SynthesizeSpeechRequest(text="Clone me.")
        request.zero_shot_data.audio_prompt = b"RIFF...."
        with pytest.raises(grpc.RpcError) as e:
            stub.Synthesize(request)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "consent" in e.value.details()
    assert "EnrollVoice" in e.value.details()


def test_long_text_is_split_and_spoken_as_one_response(tts):
    text = " ".join(f"This is sentence number {i} of a long paragraph." for i in range(12))  # > 250 chars
    resp = tts.synthesize(text, sample_rate_hz=24000)
    pieces = len(resp.audio) // 2 / SAMPLES  # each piece (a few sentences) is one synthesis
    assert pieces == int(pieces) and pieces >= len(text) / 250 and resp.meta.text == text


def test_riva_service_is_listed_by_reflection(server):
    with grpc.insecure_channel(server.grpc) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        (resp,) = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    assert "nvidia.riva.tts.RivaSpeechSynthesis" in {s.name for s in resp.list_services_response.service}


def test_pipecats_nvidia_service_against_a_keyed_server_with_its_default_voice():
    """Pipecat's NvidiaTTSService as its setup() and per-sentence synthesis run it: the synthesis
    config asked for without its metadata (answered without a key), then SynthesizeOnline with the
    key in metadata and its default voice, NVIDIA's Magpie-Multilingual.EN-US.Aria (tara here)."""
    from pipecat.services.nvidia.tts import NvidiaTTSService

    with serve_in_process("server.api_key=s3cret-riva") as srv:
        service = NvidiaTTSService(api_key="s3cret-riva", server=srv.grpc, use_ssl=False, sample_rate=22050)
        service._sample_rate = 22050  # what its setup() does in a running pipeline
        service._initialize_client()
        config = service._create_synthesis_config()  # (no metadata: refused before, so Pipecat failed to start)
        assert config.model_config[0].parameters["voice_name"] == "English-US"
        request = service._build_base_request()
        assert request.voice_name == "Magpie-Multilingual.EN-US.Aria"
        request.text = "Hello from a Pipecat bot."
        request.custom_configuration["seed"] = "3"
        audio = b"".join(r.audio for r in service._service.stub.SynthesizeOnline(
            iter([request]), metadata=service._service.auth.get_auth_metadata()))
        tara = riva.client.SpeechSynthesisService(riva.client.Auth(uri=srv.grpc, metadata_args=[
            ["authorization", "Bearer s3cret-riva"]])).synthesize(
            "Hello from a Pipecat bot.", voice_name="tara", sample_rate_hz=22050, custom_configuration={"seed": "3"})
        assert same_speech(audio, tara.audio)
        with pytest.raises(grpc.RpcError) as refused:  # only the voice list goes without a key
            list(service._service.stub.SynthesizeOnline(iter([request])))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_the_keyless_voice_list_can_be_turned_off():
    with serve_in_process("server.api_key=s3cret-riva", "riva.config_without_key=false") as srv, \
            grpc.insecure_channel(srv.grpc) as channel, pytest.raises(grpc.RpcError) as refused:
        riva_tts_pb2_grpc.RivaSpeechSynthesisStub(channel).GetRivaSynthesisConfig(
            riva_tts_pb2.RivaSynthesisConfigRequest())
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("name, voice", [("Magpie-Multilingual.EN-US.Aria", "tara"),
                                         ("magpie-multilingual.en-us.ray.Calm", "zac"),
                                         ("English-US.Male-1", "leo"), ("leo", "leo")])
def test_magpie_and_riva_names_resolve_to_lyre_voices(name, voice):
    from lyre.config import load_config

    assert load_config(None).riva.resolve_voice(name) == voice


def test_talk_py_calls_against_a_keyed_server():
    """NVIDIA's scripts/tts/talk.py, call for call, with ``--metadata authorization "Bearer <key>"``:
    ``--list-voices`` asks for the config on the bare stub (no metadata: answered without a key), and
    ``--text ... --stream`` (no --voice, 44.1 kHz, quality 20; this client's names for its arguments) and the unary form speak
    with the key."""
    with serve_in_process("server.api_key=s3cret-talk") as srv:
        auth = riva.client.Auth(None, False, srv.grpc, [["authorization", "Bearer s3cret-talk"]])
        service = riva.client.SpeechSynthesisService(auth)
        config = service.stub.GetRivaSynthesisConfig(riva.client.proto.riva_tts_pb2.RivaSynthesisConfigRequest())
        voices = [f"{m.parameters['voice_name']}.{v.split(':')[0]}" for m in config.model_config
                  for v in m.parameters["subvoices"].split(",")]
        assert "English-US.Female-1" in voices
        streamed = b"".join(r.audio for r in service.synthesize_online(
            "Hello from talk.py.", None, "en-US", sample_rate_hz=44100, zero_shot_audio_prompt_file=None, zero_shot_quality=20))
        whole = service.synthesize("Hello from talk.py.", None, "en-US", sample_rate_hz=44100, zero_shot_audio_prompt_file=None,
                                   zero_shot_quality=20).audio
        assert abs(len(streamed) // 2 - samples_at(44100)) <= 2 and abs(len(whole) // 2 - samples_at(44100)) <= 2
        keyless = riva.client.SpeechSynthesisService(riva.client.Auth(None, False, srv.grpc))
        with pytest.raises(grpc.RpcError) as refused:
            keyless.synthesize("No key.", None, "en-US", sample_rate_hz=44100)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
