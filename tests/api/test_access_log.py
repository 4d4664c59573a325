"""The access log: a line per REST request, SSE stream, WebSocket context, refused WebSocket message
and WebSocket close, gRPC and Riva call, with the account (never the key), the client, the route's
pattern, the status and error code, bytes, audio seconds, duration and the request id; refusals
are held to a burst per cause. A run that puts an API key in every header and field it can leaves
it in no line of the server's whole log."""

from __future__ import annotations

import asyncio
import json
import logging

import grpc
import pytest
import requests
import websockets
from riva.client.proto import riva_tts_pb2, riva_tts_pb2_grpc

from lyre.api.access import AccessLog, Entry
from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import start_server
from tests.support.ws import until_done, ws_url

KEY = "sk-alice-0123456789abcdef0123"
WRONG = "sk-wrong-9876543210fedcba9876"


def _traffic(srv) -> str:
    """Requests of every protocol, with the key (or a wrong one) wherever a client can put it, and a
    client token minted with it wherever that can go (returned)."""
    auth = {"Authorization": f"Bearer {KEY}"}
    everywhere = {**auth, "X-Request-Id": KEY, "User-Agent": KEY, "X-Forwarded-For": KEY, "Cookie": f"k={KEY}",
                  "X-Api-Key": KEY}
    url = srv.http + "/v1/audio/speech"
    assert requests.post(url, json={"input": "Hello.", "voice": "tara"}, timeout=60,
                         headers={**auth, "X-Request-Id": "trace-1"}).status_code == 200
    assert requests.post(url, json={"input": "Hello.", "voice": "tara", "stream_format": "sse"}, timeout=60,
                         headers=everywhere).status_code == 200
    assert requests.post(url, json={"input": KEY, "voice": KEY, "model": KEY}, headers=everywhere,
                         timeout=60).status_code == 404  # (the voice: the key, as a careless client might)
    assert requests.post(url, json={"input": "Hi."}, timeout=60,
                         headers={"Authorization": f"Bearer {WRONG}", "X-Request-Id": WRONG}).status_code == 401
    assert requests.post(url, json={"input": "Hi."}, timeout=60,  # (a key inside an id is no id either)
                         headers={"Authorization": f"Bearer {WRONG}", "X-Request-Id": f"trace-{WRONG}"}).status_code == 401
    assert requests.get(f"{srv.http}/v1/nothing/{KEY}?key={KEY}", headers=everywhere, timeout=60).status_code == 404

    async def ws():
        async with websockets.connect(ws_url(srv), additional_headers=everywhere) as sock:
            await sock.send(json.dumps({"context_id": KEY, "text": "Hi there.", "voice": "tara"}))
            await until_done(sock, KEY)
            await sock.send(json.dumps({"context_id": KEY, "append": 7}))
            assert "error" in json.loads(await sock.recv())

    asyncio.run(ws())
    token = requests.post(srv.http + "/v1/auth/tokens", headers=auth, json={}, timeout=60).json()["token"]
    with_token = {"Authorization": f"Bearer {token}", "X-Request-Id": token}
    assert requests.post(url, json={"input": "Hello.", "voice": "tara"}, headers=with_token, timeout=60).status_code == 200

    async def ws_with_token():
        async with websockets.connect(f"{ws_url(srv)}?token={token}") as sock:
            await sock.send(json.dumps({"text": "Hi there.", "voice": "tara"}))
            await until_done(sock, None)

    asyncio.run(ws_with_token())
    with grpc.insecure_channel(srv.grpc) as channel:
        metadata = (("authorization", f"Bearer {KEY}"), ("x-request-id", KEY), ("user-agent-extra", KEY))
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        assert stub.Synthesize(tts_pb2.SynthesizeRequest(text="Hi.", voice="tara"), metadata=metadata).audio
        with pytest.raises(grpc.RpcError):
            stub.Synthesize(tts_pb2.SynthesizeRequest(text="Hi."), metadata=(("authorization", f"Bearer {WRONG}"),))
        with pytest.raises(grpc.RpcError):
            riva_tts_pb2_grpc.RivaSpeechSynthesisStub(channel).Synthesize(
                riva_tts_pb2.SynthesizeSpeechRequest(text="Hi.", voice_name=KEY), metadata=metadata)
    return token


def test_every_protocol_leaves_a_line_and_no_line_holds_a_key(demo_dir):
    srv = start_server(f"server.api_keys={{{KEY}: alice, sk-bob-0000000000000000000: bob}}", "server.access_log=json")
    try:
        token = _traffic(srv)
    finally:
        assert srv.stop() == 0
    log = srv.log()
    leaked = [line for line in log.splitlines() if KEY in line or WRONG in line or token in line]
    assert not leaked, leaked  # in no line of any logger
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    by: dict = {}
    for ln in lines:
        by.setdefault((ln["route"], ln["status"]), ln)  # the first of each

    speech, sse, tokened = [ln for ln in lines if ln["route"] == "POST /v1/audio/speech" and ln["status"] == 200]
    assert tokened["account"] == "alice" and tokened["request_id"].startswith("req_")  # the token sent as its id
    assert speech["protocol"] == "rest" and speech["account"] == "alice" and speech["client"] == "127.0.0.1"
    assert speech["request_id"] == "trace-1" and speech["bytes"] > 0 and speech["audio_s"] > 0 and speech["ms"] > 0
    assert sse["request_id"].startswith("req_") and sse["audio_s"] == speech["audio_s"]  # the key sent as its id
    assert by[("POST /v1/audio/speech", 404)]["code"] == "unknown_voice"
    refused = by[("POST /v1/audio/speech", 401)]
    assert refused["account"] == "-" and refused["code"] == "unauthorized" and refused["request_id"].startswith("req_")
    assert by[("GET (no route)", 404)]["code"] == "not_found"

    context, message = by[("ws context", 200)], by[("ws message", 400)]
    assert context["protocol"] == "ws" and context["account"] == "alice" and context["audio_s"] > 0
    assert context["context"] == 1 and message["code"] == "invalid_request"
    closed = by[("GET /v1/audio/stream", 101)]
    assert closed["messages"] == 2 and closed["contexts"] == 1 and closed["audio_s"] == context["audio_s"]

    call = by[("lyre.v1.TextToSpeech/Synthesize", "OK")]
    assert call["protocol"] == "grpc" and call["account"] == "alice" and call["bytes"] > 0 and call["audio_s"] > 0
    assert by[("lyre.v1.TextToSpeech/Synthesize", "UNAUTHENTICATED")]["code"] == "unauthorized"
    riva = by[("nvidia.riva.tts.RivaSpeechSynthesis/Synthesize", "NOT_FOUND")]
    assert riva["protocol"] == "riva" and riva["code"] == "unknown_voice" and riva["account"] == "alice"


def test_refusals_are_held_to_a_burst_per_cause_and_the_next_line_says_how_many(caplog):
    now = [0.0]
    access = AccessLog("text", interval_s=60.0, burst=3, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="lyre.access")

    def line(status, client="10.0.0.1"):
        access.write(Entry("rest", "POST /v1/audio/speech", client, "req_x", status=status, code="unauthorized"))

    for _ in range(5):
        line(401)
    line(401, "10.0.0.2")  # another client: its own cause
    for _ in range(4):
        line(200)  # served requests are never held back
    now[0] = 61.0
    line(401)
    texts = [r.getMessage() for r in caplog.records if r.name == "lyre.access"]
    assert len(texts) == 3 + 1 + 4 + 1
    assert texts[-1].endswith("held_back=2") and "client=10.0.0.1" in texts[-1] and "status=401" in texts[-1]
    assert all("held_back" not in t for t in texts[:-1])
    assert 'route="POST /v1/audio/speech"' in texts[0] and "code=unauthorized" in texts[0]
    AccessLog("off").write(Entry("rest", "GET /health", None, "req_y", status=200))
    assert len([r for r in caplog.records if r.name == "lyre.access"]) == len(texts)
