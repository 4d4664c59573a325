"""SSML as served (issue 32): a text that starts with <speak> is a document on every protocol (REST
``input`` through the openai SDK, WebSocket text and appends, gRPC, Riva's ``text`` through NVIDIA's
client); its breaks are silence in the audio stream, exactly as long as asked; a prosody rate
stretches its segment's audio; timestamps point into the document the caller sent; a document Lyre
does not read gets a clear 400 / INVALID_ARGUMENT, and ``ssml: off`` reads the markup as text. Each
segment of the test server speaks MAX_TOKENS tokens, so its audio has a known length."""

from __future__ import annotations

import asyncio
import json

import grpc
import numpy as np
import openai
import pytest
import requests
import riva.client
import websockets

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import MAX_TOKENS, same_speech, serve_in_process

SEGMENT = MAX_TOKENS // 7 * 2048  # samples of one segment's speech at 24 kHz
DOC = ('<speak>Your balance is <say-as interpret-as="currency">$1,234.50</say-as>.'
       '<break time="1s"/><p>Call <say-as interpret-as="telephone">415 555 0100</say-as>.</p></speak>')


@pytest.fixture(scope="module")
def server():
    with serve_in_process() as srv:
        yield srv


def ws_run(server, *messages: dict) -> tuple[bytes, list[dict], dict]:
    """Send ``messages`` on one socket; the audio, the timestamps messages and the last message."""
    async def go():
        audio, stamps = bytearray(), []
        async with websockets.connect(server.http.replace("http", "ws") + "/v1/audio/stream") as ws:
            for m in messages:
                await ws.send(json.dumps({"voice": "tara", "seed": 1, "response_format": "pcm", **m}))
            while True:
                reply = await ws.recv()
                if isinstance(reply, bytes):
                    audio.extend(reply)
                    continue
                message = json.loads(reply)
                if message.get("type") == "timestamps":
                    stamps.append(message)
                elif message.get("done") or message.get("error"):
                    return bytes(audio), stamps, message

    return asyncio.run(go())


def test_breaks_are_silence_of_their_length_and_timestamps_point_into_the_document(server):
    audio, stamps, done = ws_run(server, {"text": DOC, "timestamps": "pieces"})
    assert done.get("done"), done
    assert len(audio) // 2 == 2 * SEGMENT + 24000  # two segments' speech and the one-second break
    pieces = [p for m in stamps for p in m.get("pieces", [m])]
    assert [p["text"] for p in pieces] == ["Your balance is $1,234.50.", "Call 415 555 0100."]
    assert DOC[pieces[1]["start_char"]:pieces[1]["end_char"]] == (
        'Call <say-as interpret-as="telephone">415 555 0100</say-as>.')
    assert pieces[1]["start_s"] - pieces[0]["end_s"] == pytest.approx(1.0)
    pcm = np.frombuffer(audio, dtype=np.int16)
    rms = lambda x: float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))  # noqa: E731
    assert rms(pcm[SEGMENT:SEGMENT + 24000]) < 0.02 * rms(pcm[:SEGMENT])  # (a watermark's trace is all it holds)


def test_a_prosody_rate_stretches_its_segment_and_nothing_else(server):
    slow, _, done = ws_run(server, {"text": '<speak><prosody rate="x-slow">Slowly now.</prosody> Quick.</speak>'})
    assert done.get("done"), done
    assert len(slow) // 2 == pytest.approx(SEGMENT / 0.6 + SEGMENT, abs=64)


def test_a_document_appended_to_an_utterance_is_spoken_after_the_text_before_it(server):
    audio, stamps, done = ws_run(server, {"append": "First this. ", "timestamps": "pieces"},
                                 {"append": '<speak>Then <break time="500ms"/>that.</speak>'}, {"end": True})
    assert done.get("done"), done
    pieces = [p for m in stamps for p in m.get("pieces", [m])]
    sent = "First this. " + '<speak>Then <break time="500ms"/>that.</speak>'
    assert [sent[p["start_char"]:p["end_char"]] for p in pieces] == ["First this.", "Then", "that."]
    assert len(audio) // 2 == 3 * SEGMENT + 12000


def test_marked_text_reaches_the_model_as_marked(server):
    def prompt_tokens(body: dict) -> int:
        _, _, done = ws_run(server, {"max_tokens": 7, **body})
        assert done.get("done"), done
        return done["metrics"]["prompt_tokens"]

    digits = prompt_tokens({"text": '<speak>Code <say-as interpret-as="digits">4471</say-as>.</speak>'})
    assert digits == prompt_tokens({"text": "Code four four seven one."})
    assert prompt_tokens({"text": '<speak>Code <say-as interpret-as="digits">4471</say-as>.</speak>',
                          "ssml": "off"}) > digits  # (the markup itself read as text)


def test_the_openai_sdk_gets_audio_for_a_document_and_a_clear_400_for_a_bad_one(server):
    client = openai.OpenAI(base_url=server.http + "/v1", api_key="unused")
    audio = client.audio.speech.create(model="tts-1", voice="tara", input=DOC, response_format="pcm").content
    assert len(audio) // 2 == 2 * SEGMENT + 24000
    with pytest.raises(openai.BadRequestError, match="SSML tag <audio> is not one Lyre reads"):
        client.audio.speech.create(model="tts-1", voice="tara", input="<speak><audio src='a.wav'/>Hi.</speak>")
    with pytest.raises(openai.BadRequestError, match="may not declare a document type"):
        client.audio.speech.create(model="tts-1", voice="tara", input=(
            '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
            "<speak>&b;</speak>"))
    lenient = requests.post(server.http + "/v1/audio/speech", timeout=60, json={
        "input": "<speak><audio src='a.wav'/>Hi.</speak>", "voice": "tara", "ssml": "lenient",
        "response_format": "pcm"})
    assert lenient.status_code == 200 and len(lenient.content) // 2 == SEGMENT


def test_grpc_and_riva_clients_send_ssml_in_their_text_field(server):
    with grpc.insecure_channel(server.grpc) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        reply = stub.Synthesize(tts_pb2.SynthesizeRequest(text=DOC))
        assert len(reply.audio) // 2 == 2 * SEGMENT + 24000
        with pytest.raises(grpc.RpcError) as e:
            stub.Synthesize(tts_pb2.SynthesizeRequest(text="<speak><break time='1 hour'/>x</speak>"))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "<break time='1 hour'>" in e.value.details()
    tts = riva.client.SpeechSynthesisService(riva.client.Auth(uri=server.grpc))
    resp = tts.synthesize(DOC, voice_name="English-US.Female-1", sample_rate_hz=24000)
    assert len(resp.audio) // 2 == 2 * SEGMENT + 24000
    with pytest.raises(grpc.RpcError) as e:
        tts.synthesize("<speak>unclosed", sample_rate_hz=24000)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not well-formed" in e.value.details()


def test_rivas_language_code_picks_the_normalisation_rules(server):
    tts = riva.client.SpeechSynthesisService(riva.client.Auth(uri=server.grpc))

    def audio(text: str, language: str) -> bytes:
        return tts.synthesize(text, language_code=language, sample_rate_hz=24000,
                              custom_configuration={"seed": "3"}).audio

    british = audio("Due 03/04/2027.", "en-GB")
    assert same_speech(british, audio("Due April third, twenty twenty-seven.", "en-US"))  # the 3rd of April
    assert not same_speech(british, audio("Due 03/04/2027.", "en-US"))  # (March fourth)


def test_appended_documents_are_checked_whole_and_plain_text_is_never_read_as_ssml(server):
    # a document with nothing to say is refused at its append; the utterance goes on
    audio, stamps, done = ws_run(server, {"append": "First. ", "timestamps": "pieces"},
                                 {"append": '<speak><break time="2s"/></speak>'})
    assert "no text to speak" in done["error"]["message"], done
    # plain text that holds markup mid-sentence is text; a document's closing tag is not looked in for words
    sent = ["Well, <speak>x</speak> is a tag. ", "<speak>Hi</speak>", " speak up."]
    audio, stamps, done = ws_run(server, *({"append": a, "timestamps": "pieces"} for a in sent), {"end": True})
    assert done.get("done"), done
    pieces = [p for m in stamps for p in m.get("pieces", [m])]
    whole = "".join(sent)
    assert [whole[p["start_char"]:p["end_char"]] for p in pieces] == [
        "Well,", "<speak>x</speak> is a tag.", "Hi", "speak up."]
