"""Text normalisation as served (issue 32): on by default on every protocol, switchable per request
(``text_normalization``: auto | on | off), the caller's text kept for everything reported back
(timestamps' spans are the caller's characters). The demo's audio is noise, so what the model read
is seen in the prompt the engine was given: a request's prompt tokens, the same for "$5" as for
"five dollars" written out, and other for "off"."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
import requests
import websockets

from lyre.service.text import spoken
from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import serve_in_process
from tests.support.ws import prompt_tokens


@pytest.fixture(scope="module")
def server():
    with serve_in_process() as srv:
        yield srv


def test_numbers_are_said_as_words_unless_the_request_says_off(server):
    written, words = "It costs $5 for 2 GB.", "It costs five dollars for two gigabytes."
    assert prompt_tokens(server, {"text": written}) == prompt_tokens(server, {"text": words})
    assert prompt_tokens(server, {"text": written, "text_normalization": "on"}) == prompt_tokens(server, {"text": words})
    assert prompt_tokens(server, {"text": written, "text_normalization": "off"}) != prompt_tokens(server, {"text": words})


def test_a_bad_value_is_refused_naming_the_field_on_every_protocol(server):
    async def ws() -> dict:
        async with websockets.connect(server.http.replace("http", "ws") + "/v1/audio/stream") as sock:
            await sock.send(json.dumps({"text": "Hi.", "text_normalization": "maybe"}))
            return json.loads(await sock.recv())

    assert "text_normalization" in asyncio.run(ws())["error"]["message"]
    response = requests.post(server.http + "/v1/audio/speech", json={"input": "Hi.", "text_normalization": "maybe"},
                             timeout=30)
    assert response.status_code == 422 and "text_normalization" in response.json()["error"]["message"]
    with grpc.insecure_channel(server.grpc) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.Synthesize(tts_pb2.SynthesizeRequest(text="Hi.", text_normalization="maybe"))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "text_normalization" in e.value.details()
        reply = stub.Synthesize(tts_pb2.SynthesizeRequest(text="Pay $5.", text_normalization="off",
                                                          sampling=tts_pb2.SamplingOptions(max_tokens=28)))
        assert len(reply.audio) > 0


def test_timestamps_span_the_callers_characters(server):
    async def go() -> list[dict]:
        async with websockets.connect(server.http.replace("http", "ws") + "/v1/audio/stream") as ws:
            await ws.send(json.dumps({"text": "Pay $1,234.50 today. Call 555-0100 now.", "voice": "tara",
                                      "timestamps": "pieces", "seed": 1, "max_tokens": 28}))
            out = []
            while True:
                reply = await ws.recv()
                if isinstance(reply, bytes):
                    continue
                message = json.loads(reply)
                if message.get("done"):
                    return out
                if message.get("type") == "timestamps":
                    out.append(message)

    pieces = [p for m in asyncio.run(go()) for p in m.get("pieces", [m])]
    texts = [p["text"] for p in pieces]
    assert texts == ["Pay $1,234.50 today.", "Call 555-0100 now."]  # (the caller's, not "one thousand ...")


def test_language_auto_reads_english_rules_only_into_latin_text():
    assert spoken(["Pay $5.", "付款5美元。"], None, None) == ["Pay five dollars.", "付款5美元。"]
    assert spoken(["Pay $5."], "german", "auto") == ["Pay $5."]
    with pytest.raises(Exception, match="no normalisation rules for language 'german'"):
        spoken(["Pay $5."], "german", "on")


def test_an_amount_split_across_appends_is_read_once_as_one_amount(server):
    async def go(messages: list[dict]) -> dict:
        async with websockets.connect(server.http.replace("http", "ws") + "/v1/audio/stream") as ws:
            for m in messages:
                await ws.send(json.dumps({"voice": "tara", "seed": 1, "max_tokens": 28, **m}))
            while isinstance(reply := await ws.recv(), bytes):
                pass
            return json.loads(reply)

    whole = asyncio.run(go([{"append": "Pay $1,234.50 now."}, {"end": True}]))
    split = asyncio.run(go([{"append": "Pay $1,"}, {"append": "234.50 now."}, {"end": True}]))
    words = asyncio.run(go([{"append": "Pay one thousand two hundred thirty-four dollars and fifty cents now."},
                            {"end": True}]))
    assert split["metrics"]["prompt_tokens"] == whole["metrics"]["prompt_tokens"] == words["metrics"]["prompt_tokens"]
    assert split["metrics"]["pieces"] == 1
