"""The hostile corpus (issue 32) sent as a caller would, on REST, WebSocket and gRPC: SSML bombs and
malformed documents, a megabyte of digits, mixed scripts, right-to-left text, zero-width and control
characters, unpaired surrogates. Each gets a clear 4xx (gRPC INVALID_ARGUMENT) naming its problem,
or audio; the server stays up for the next caller. (Bounded time: the test's own timeout.)"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
import requests
import websockets

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import serve_in_process
from tests.support.ws import ws_url

LAUGHS = ('<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY a "ha"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">'
          '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;">]><speak>&c;&c;&c;&c;</speak>')
CORPUS = {
    "billion laughs": (LAUGHS, "may not declare a document type"),
    "external entity": ('<!DOCTYPE speak SYSTEM "file:///etc/passwd"><speak>x</speak>', "may not declare"),
    "deep nesting": ("<speak>" + "<s>" * 500 + "x" + "</s>" * 500 + "</speak>", "nests deeper than 32"),
    "unclosed": ("<speak><p>Hello", "not well-formed"),
    "break flood": ("<speak>" + '<break time="10s"/>' * 100 + "x</speak>", "more than 60 s of silence"),
    "digits": ("1" * 4000, "4000 characters"),  # (one word too long for a segment: refused, not cut mid-number)
    "mixed scripts": ("Pay ₹500 to Ελένη at 3pm 東京 and Москва, ok?", None),
    "right to left": ("\u202eשלום\u202c عليكم 123 شكرا", None),
    "zero width": ("Pay\u200b $5\u200d now\ufeff please\u2060.", None),
    "control characters": ("Hello\x00 there\x07\x1b[31m red", None),
    "surrogate": ("Hello \ud800 there", "lone surrogate"),
}


@pytest.fixture(scope="module")
def server():
    with serve_in_process("sampling.max_tokens=7", "sampling.min_tokens=7") as srv:
        yield srv


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(CORPUS))
def test_each_protocol_answers_clearly_and_the_server_stays_up(server, name):
    text, problem = CORPUS[name]
    body = json.dumps({"input": text, "voice": "tara", "response_format": "pcm"})  # (a lone surrogate as \ud800)
    rest = requests.post(server.http + "/v1/audio/speech", data=body, timeout=120,
                         headers={"Content-Type": "application/json"})
    if problem is None:
        assert rest.status_code == 200 and len(rest.content) > 0, rest.text[:300]
    else:
        assert 400 <= rest.status_code < 500 and problem in rest.json()["error"]["message"], rest.text[:300]

    async def ws() -> dict:
        async with websockets.connect(ws_url(server)) as sock:
            await sock.send(json.dumps({"text": text, "voice": "tara"}))
            while isinstance(reply := await sock.recv(), bytes):
                pass
            return json.loads(reply)

    reply = asyncio.run(ws())
    if problem is None:
        assert reply.get("done"), reply
    else:
        assert problem in reply["error"]["message"], reply

    with grpc.insecure_channel(server.grpc) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        try:
            audio = stub.Synthesize(tts_pb2.SynthesizeRequest(text=text.encode("utf-8", "replace").decode()
                                                              if problem == "lone surrogate" else text)).audio
        except grpc.RpcError as e:
            assert problem is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
        else:
            assert problem in (None, "lone surrogate") and len(audio) > 0  # (protobuf carries no lone surrogate)
    assert requests.get(server.http + "/health", timeout=30).status_code == 200
