"""Accounts on one real server: an account at its quota is refused (429 / RESOURCE_EXHAUSTED with
Retry-After, naming the quota) while another account's request is served at once, even when the
first account's backlog is queued for the same slots; WebSocket contexts are counted over all of an
account's sockets; characters per minute are counted; a stalled enrollment upload holds its
account's place only until the body timeout cuts it; each account sees only its own figures, and
/metrics needs an operator's key."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import grpc
import pytest
import requests
import websockets

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import HOLD_SETTINGS, HeldStream, serve_in_process
from tests.support.voices import enroll
from tests.support.waiting import until, until_async
from tests.support.ws import until_done, ws_url

KEYS = {"attacker": "k-attacker", "victim": "k-victim", "ops": "k-ops", "chatty": "k-chatty"}
QUOTAS = {"attacker": {"max_sessions": 2, "max_queued": 1, "max_ws_contexts": 2, "max_enrollments": 1},
          "chatty": {"chars_per_minute": 40}}


def auth(account: str) -> dict:
    return {"Authorization": f"Bearer {KEYS[account]}"}


@pytest.fixture(scope="module")
def shared(demo_dir):
    keys = ", ".join(f"{key}: {account}" for account, key in KEYS.items())
    with serve_in_process(*HOLD_SETTINGS, "scheduler.max_concurrent_sessions=3", "scheduler.max_batch_size=3",
                          f"server.api_keys={{{keys}}}", "server.operator_accounts=[ops]",
                          f"accounts.quotas={json.dumps(QUOTAS)}", "server.header_timeout_s=1",
                          "server.body_min_bytes_per_s=2000") as s:
        yield s
        assert s.stop() == 0


def speech(srv, account: str, text: str = "Hello there.", **extra) -> requests.Response:
    return requests.post(srv.http + "/v1/audio/speech", headers=auth(account), timeout=120,
                         json={"input": text, "response_format": "pcm", **extra})


def test_an_account_at_its_quota_waits_and_is_refused_while_another_is_served_at_once(shared):
    held = [HeldStream(shared, headers=auth("attacker")) for _ in range(2)]  # its 2 slots (of 3)
    try:
        queued = threading.Thread(target=speech, args=(shared, "attacker"), daemon=True)
        queued.start()  # its third: queued behind its own quota of slots, though a slot is free
        until(lambda: stats(shared, "attacker")["account"]["pending_sessions"] == 1, what="the queued request")
        refused = speech(shared, "attacker")  # its fourth: past max_sessions + max_queued
        served = speech(shared, "victim")  # the free slot is the victim's, ahead of the attacker's queue
        with grpc.insecure_channel(shared.grpc) as channel:
            with pytest.raises(grpc.RpcError) as over:
                tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(
                    tts_pb2.SynthesizeRequest(text="hi"), metadata=(("authorization", f"Bearer {KEYS['attacker']}"),))
        mine, everything = stats(shared, "attacker"), stats(shared, "ops")
        metrics = requests.get(shared.http + "/metrics", headers=auth("ops"), timeout=30).text
    finally:
        for stream in held:
            stream.close()
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "quota_exceeded"
    assert "'attacker'" in refused.json()["error"]["message"]
    assert "accounts.max_sessions + accounts.max_queued" in refused.json()["error"]["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    assert served.status_code == 200 and len(served.content) > 0
    assert over.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert int(dict(over.value.trailing_metadata())["retry-after"]) >= 1
    # the attacker sees the load and its own sessions, not the engine's figures; an operator sees all
    assert (mine["account"]["name"], mine["account"]["active_sessions"]) == ("attacker", 2)
    assert "engine" not in mine and "accounts" not in mine and "cpu_seconds" not in mine
    assert "engine" in everything and everything["accounts"]["attacker"]["active_sessions"] == 2
    assert everything["cpu_seconds"]["process"] > everything["cpu_seconds"]["model"] > 0
    assert 'lyre_account_sessions{account="attacker",state="active"} 2.0' in metrics
    assert 'lyre_account_refusals_total{account="attacker",quota="accounts.max_sessions + accounts.max_queued"}' \
        in metrics
    queued.join(timeout=120)


def stats(srv, account: str) -> dict:
    return requests.get(srv.http + "/v1/stats", headers=auth(account), timeout=30).json()


def test_metrics_need_an_operators_key(shared):
    assert requests.get(shared.http + "/metrics", timeout=30).status_code == 401
    denied = requests.get(shared.http + "/metrics", headers=auth("victim"), timeout=30)
    assert denied.status_code == 403 and "server.operator_accounts" in denied.json()["error"]["message"]
    assert requests.get(shared.http + "/metrics", headers=auth("ops"), timeout=30).status_code == 200
    token = requests.post(shared.http + "/v1/auth/tokens", headers=auth("ops"), json={}, timeout=30).json()["token"]
    as_token = requests.get(shared.http + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert as_token.status_code == 403  # an operator's client token (a page's) is not the operator's key


def test_websocket_contexts_are_counted_over_all_of_an_accounts_sockets(shared):
    async def go():
        extra = [("Authorization", auth("attacker")["Authorization"])]
        first = await websockets.connect(ws_url(shared), additional_headers=extra)
        second = await websockets.connect(ws_url(shared), additional_headers=extra)
        for ws in (first, second):  # one open context each, waiting for the end of a sentence
            await ws.send(json.dumps({"context_id": "c", "append": "waiting for more"}))
        await second.send(json.dumps({"context_id": "d", "append": "one too many"}))
        refused = json.loads(await second.recv())
        async with websockets.connect(ws_url(shared), additional_headers=[("Authorization",
                                                                          auth("victim")["Authorization"])]) as v:
            await v.send(json.dumps({"text": "Mine."}))
            audio, done = await until_done(v)
        await first.close()  # its context ends: the attacker may open another

        async def reopened():
            await second.send(json.dumps({"context_id": "e", "append": "now there is room"}))
            await second.send(json.dumps({"context_id": "e", "cancel": True}))
            reply = json.loads(await second.recv())
            return reply if "error" not in reply else None

        again = await until_async(reopened, what="a context place freed by the closed socket")
        await second.close()
        return refused, done, again

    refused, done, again = asyncio.run(go())
    assert refused["error"]["code"] == "quota_exceeded" and refused["context_id"] == "d"
    assert "accounts.max_ws_contexts" in refused["error"]["message"]
    assert done["done"] and again["done"]


def test_a_context_cancelled_before_it_started_gives_its_place_back(shared):
    async def go():
        async with websockets.connect(ws_url(shared), additional_headers=[
                ("Authorization", auth("victim")["Authorization"])]) as ws:
            for i in range(4):  # each opened and cancelled at once: often in one read of the socket
                await ws.send(json.dumps({"context_id": f"c{i}", "text": "Hi."}))
                await ws.send(json.dumps({"context_id": f"c{i}", "cancel": True}))
                while not (reply := json.loads(await ws.recv())).get("cancelled"):
                    assert "error" not in reply, reply
            await until_async(lambda: stats(shared, "victim")["account"]["ws_contexts"] == 0,
                              what="every cancelled context's place back")
            await ws.send(json.dumps({"context_id": "last", "text": "Still welcome."}))
            return await until_done(ws, "last")

    audio, done = asyncio.run(go())
    assert done["done"] and audio


def test_characters_per_minute_are_counted(shared):
    assert speech(shared, "chatty", "Twenty-five characters..").status_code == 200
    over = speech(shared, "chatty", "Twenty-five characters..")
    assert over.status_code == 429 and "accounts.chars_per_minute" in over.json()["error"]["message"]
    assert int(over.headers["Retry-After"]) >= 1
    assert speech(shared, "victim", "Twenty-five characters..").status_code == 200  # its own minute
    too_long = speech(shared, "chatty", "x" * 41)
    assert too_long.status_code == 422 and "at most 40 a minute" in too_long.json()["error"]["message"]


def test_a_stalled_enrollment_holds_its_accounts_place_until_the_body_timeout_cuts_it(shared):
    port = int(shared.http.rsplit(":", 1)[1])
    stalled = socket.create_connection(("127.0.0.1", port), timeout=60)
    stalled.sendall(b"POST /v1/voices HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k-attacker\r\n"
                    b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 500000\r\n\r\n--b\r\n")
    try:
        until(lambda: stats(shared, "attacker")["account"]["enrollments"] == 1, what="the stalled upload's place")
        refused = enroll(shared, "Ann", headers=auth("attacker"))
        victim = enroll(shared, "Vic", headers=auth("victim"))  # another account's enrollment goes on
        assert stalled.recv(65536) == b""  # cut: far below server.body_min_bytes_per_s
    finally:
        stalled.close()
    assert refused.status_code == 429 and "accounts.max_enrollments" in refused.json()["error"]["message"]
    assert victim.status_code == 201
    until(lambda: stats(shared, "attacker")["account"]["enrollments"] == 0, what="the cut upload's place back")
    assert enroll(shared, "Ann", headers=auth("attacker")).status_code == 201
