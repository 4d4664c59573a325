"""Short-lived client tokens (``POST /v1/auth/tokens``): minted with an API key, bound to its
account, valid to start a request or connection until they expire, accepted as a Bearer on REST
and gRPC and in the WebSocket's URL or subprotocol (where an API key is refused), narrowed to some
voices and a longest WebSocket when asked; forged, foreign and expired tokens are refused. Real
clients against a real server; the token's clock is the one thing moved by hand."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest
import requests
import websockets

from lyre.config import ConfigError, load_config
from lyre.trust.accounts import Accounts
from lyre.trust.tokens import Scope, Tokens
from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import serve_in_process

KEYS = {"k-ann-0123456789": "ann", "k-bob-0123456789": "bob"}
ANN = {"Authorization": "Bearer k-ann-0123456789"}


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def server():
    keys = "{" + ", ".join(f"{k}: {a}" for k, a in KEYS.items()) + "}"
    with serve_in_process(f"server.api_keys={keys}", "server.token_secret=a-test-secret-of-32-bytes-or-so") as srv:
        yield srv


def mint(srv, headers=ANN, **body) -> requests.Response:
    return requests.post(srv.http + "/v1/auth/tokens", headers=headers, json=body, timeout=30)


def speak(srv, token: str, **body) -> requests.Response:
    return requests.post(srv.http + "/v1/audio/speech", headers={"Authorization": f"Bearer {token}"}, timeout=60,
                         json={"input": "Hi.", "response_format": "pcm", "max_tokens": 14, **body})


def test_a_key_mints_a_token_of_its_account_that_works_where_the_key_does(server):
    r = mint(server)
    assert r.status_code == 201 and r.headers["Cache-Control"] == "no-store"
    grant = r.json()
    assert grant["account"] == "ann" and grant["expires_in_s"] == 60 and grant["voices"] is None
    token = grant["token"]
    assert speak(server, token).status_code == 200
    with grpc.insecure_channel(server.grpc) as channel:
        replies = list(tts_pb2_grpc.TextToSpeechStub(channel).SynthesizeStream(
            tts_pb2.SynthesizeRequest(text="Hi.", sampling=tts_pb2.SamplingOptions(max_tokens=14)),
            metadata=(("authorization", f"Bearer {token}"),), timeout=60))
    assert replies
    assert mint(server, headers={}).status_code == 401


def test_a_token_may_only_speak_and_list_voices_never_manage_them(server):
    """Whatever its scope: a page holding it cannot delete the account's voices, read consent records
    or stats, verify, or mint tokens (a key can)."""
    token = mint(server).json()["token"]
    bearer = {"Authorization": f"Bearer {token}"}
    assert requests.get(server.http + "/v1/voices", headers=bearer, timeout=30).status_code == 200
    for method, path in (("POST", "/v1/auth/tokens"), ("GET", "/v1/stats"), ("DELETE", "/v1/voices/v_0123456789abcdef"),
                         ("GET", "/v1/voices/tara"), ("GET", "/v1/voices/v_0123456789abcdef/consent"),
                         ("POST", "/v1/voices"), ("POST", "/v1/audio/verify")):
        r = requests.request(method, server.http + path, headers=bearer, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["code"] == "not_permitted", path
    with grpc.insecure_channel(server.grpc) as channel, pytest.raises(grpc.RpcError) as info:
        tts_pb2_grpc.TextToSpeechStub(channel).DeleteVoice(tts_pb2.DeleteVoiceRequest(id="v_0123456789abcdef"),
                                                           metadata=(("authorization", f"Bearer {token}"),))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    other = Tokens(b"a-test-secret-of-32-bytes-or-so").mint("mallory")[0]  # signed right, for no account here
    assert speak(server, other).status_code == 401


def test_forged_foreign_and_expired_tokens_are_refused(server):
    token = mint(server, expires_in_s=5).json()["token"]
    body, _, signature = token.rpartition(".")
    forged = body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1] + "." + signature
    foreign = Tokens(b"another replica's secret!").mint("ann")[0]
    for bad in (forged, foreign, "lyre_t.", "lyre_t.x.y"):
        r = speak(server, bad)
        assert r.status_code == 401 and "expired API key or token" in r.json()["error"]["message"], bad
    tokens = server.service.accounts.client_tokens
    real = tokens.clock
    try:
        tokens.clock = lambda: real() + 6  # its 5 s have passed
        assert speak(server, token).status_code == 401
    finally:
        tokens.clock = real


def test_a_browser_websocket_passes_its_token_in_the_url_or_a_subprotocol_never_a_key(server):
    token = mint(server).json()["token"]
    url = server.http.replace("http://", "ws://") + "/v1/audio/stream"

    async def spoken(target: str, **kwargs) -> tuple[str | None, bool]:
        async with websockets.connect(target, **kwargs) as ws:
            await ws.send('{"text": "Hi.", "max_tokens": 14}')
            while True:
                reply = await ws.recv()
                if isinstance(reply, str) and '"done"' in reply:
                    return ws.subprotocol, True

    assert asyncio.run(spoken(f"{url}?token={token}")) == (None, True)
    chosen = f"lyre-token.{token}"
    assert asyncio.run(spoken(url, subprotocols=[chosen])) == (chosen, True)  # named back, as a browser needs
    assert asyncio.run(spoken(url, subprotocols=["lyre", chosen])) == ("lyre", True)  # the token is not echoed
    for bad in (f"{url}?api_key=k-ann-0123456789", f"{url}?token=k-ann-0123456789"):
        with pytest.raises(websockets.InvalidStatus) as refused:
            asyncio.run(spoken(bad))
        assert refused.value.response.status_code == 401
        assert b"not accepted in URLs" in refused.value.response.body


def test_a_token_narrowed_to_voices_speaks_only_those_on_every_surface(server):
    r = mint(server, voices=["Tara"])
    assert r.json()["voices"] == ["tara"]
    token = r.json()["token"]
    assert speak(server, token, voice="tara").status_code == 200
    refused = speak(server, token, voice="leo")
    assert refused.status_code == 403 and "may speak only tara" in refused.json()["error"]["message"]
    with grpc.insecure_channel(server.grpc) as channel, pytest.raises(grpc.RpcError) as info:
        list(tts_pb2_grpc.TextToSpeechStub(channel).SynthesizeStream(
            tts_pb2.SynthesizeRequest(text="Hi.", voice="leo"), metadata=(("authorization", f"Bearer {token}"),),
            timeout=60))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert mint(server, voices=["nobody"]).status_code == 404  # checked when it is minted
    assert mint(server, expires_in_s=601).status_code == 422
    assert mint(server, voices=[]).status_code == 400  # (a token that may speak nothing)


def test_a_websocket_opened_with_a_session_limited_token_is_closed_when_it_is_over(server):
    token = mint(server, max_session_s=1).json()["token"]
    url = server.http.replace("http://", "ws://") + f"/v1/audio/stream?token={token}"

    async def until_closed():
        async with websockets.connect(url) as ws:
            await ws.wait_closed()
            return ws.close_code, ws.close_reason

    code, reason = asyncio.run(asyncio.wait_for(until_closed(), 60))
    assert code == 1008 and "max_session_s" in reason

    with grpc.insecure_channel(server.grpc) as channel, pytest.raises(grpc.RpcError) as info:
        def never_done():  # a stream whose client never ends it: only the token's limit does
            yield tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.StreamingConfig(voice="tara"))
            threading.Event().wait(120)

        list(tts_pb2_grpc.TextToSpeechStub(channel).StreamingSynthesize(
            never_done(), metadata=(("authorization", f"Bearer {token}"),), timeout=60))
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "max_session_s" in info.value.details()


def test_tokens_are_signed_expire_and_replicas_sharing_a_secret_accept_each_others():
    clock = Clock()
    a, b = Tokens(b"shared-secret-0123456789", clock), Tokens(b"shared-secret-0123456789", clock)
    token, grant = a.mint("ann", 60, Scope(("tara",), 30.0))
    assert b.verify(token) == grant and grant.scope.voices == ("tara",)
    assert Tokens(b"other-secret-0123456789!", clock).verify(token) is None
    clock.now += 61
    assert b.verify(token) is None
    assert a.mint("ann", 10_000)[1].expires_at == clock.now + 600  # at most 10 minutes


def test_a_short_or_unreadable_secret_is_refused_at_start(tmp_path):
    for overrides, message in ((["server.token_secret=short"], "too short"),
                               ([f"server.token_secret_file={tmp_path / 'missing'}"], "cannot be read")):
        with pytest.raises(ConfigError, match=message):
            Accounts(load_config(None, overrides).server)
