"""Browsers (CORS): pages on ``server.cors_origins`` may call it, their
preflights are answered without a key, their answers (errors and streams too) name the origin and
expose the headers a page reads; any other page is refused before any work, its "simple"
``text/plain`` POST and its WebSocket handshake included. A page the server served itself (the
playground) reaches it unlisted where DNS rebinding cannot forge its origin: on a keyed server, or
at an IP address or localhost. Real requests and a real WebSocket client against a real server,
sending what a browser sends."""

from __future__ import annotations

import asyncio
import logging

import pytest
import requests
import websockets

from lyre.config import ConfigError, load_config
from tests.support.servers import serve_in_process

PAGE = "https://app.example.com"
STRANGER = "https://evil.example.net"
KEY = {"Authorization": "Bearer s3cret"}
SPEECH = "/v1/audio/speech"


@pytest.fixture(scope="module")
def server():
    with serve_in_process(f"server.cors_origins=[{PAGE}]", "server.api_key=s3cret") as srv:
        yield srv


def preflight(srv, path: str, origin: str, method: str = "POST") -> requests.Response:
    return requests.options(srv.http + path, timeout=30, headers={
        "Origin": origin, "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "authorization, content-type"})


def test_a_listed_pages_preflight_is_answered_without_a_key_with_what_the_route_accepts(server):
    r = preflight(server, SPEECH, PAGE)
    assert r.status_code == 204 and r.headers["Access-Control-Allow-Origin"] == PAGE
    assert set(r.headers["Access-Control-Allow-Methods"].split(", ")) == {"POST", "OPTIONS"}
    assert {"Authorization", "Content-Type"} <= set(r.headers["Access-Control-Allow-Headers"].split(", "))
    assert int(r.headers["Access-Control-Max-Age"]) > 0 and "Origin" in r.headers["Vary"]
    voice = preflight(server, "/v1/voices/v_0123456789abcdef", PAGE, "DELETE")
    assert set(voice.headers["Access-Control-Allow-Methods"].split(", ")) == {"GET", "HEAD", "DELETE", "OPTIONS"}
    assert preflight(server, "/v1/nothing", PAGE).status_code == 404


def test_a_listed_pages_answers_name_it_and_expose_what_a_page_reads(server):
    r = requests.post(server.http + SPEECH, headers={**KEY, "Origin": PAGE}, timeout=60,
                      json={"input": "From a page.", "response_format": "pcm", "max_tokens": 14})
    assert r.status_code == 200 and r.content  # a stream: its headers went out before its audio
    assert r.headers["Access-Control-Allow-Origin"] == PAGE
    assert {"X-Request-Id", "Retry-After"} <= set(r.headers["Access-Control-Expose-Headers"].split(", "))
    denied = requests.get(server.http + "/v1/voices", headers={"Origin": PAGE}, timeout=30)  # no key
    assert denied.status_code == 401 and denied.headers["Access-Control-Allow-Origin"] == PAGE  # the page can read why


def test_any_other_page_is_refused_before_any_work_simple_requests_and_websockets_too(server):
    before = requests.get(server.http + "/v1/stats", headers=KEY, timeout=30).json()["total_tokens"]
    assert preflight(server, SPEECH, STRANGER).status_code == 403
    for headers, body in (({"Content-Type": "text/plain"}, '{"input": "Spend their capacity."}'),
                          ({"Content-Type": "application/json"}, '{"input": "Spend their capacity."}')):
        r = requests.post(server.http + SPEECH, headers={**KEY, **headers, "Origin": STRANGER}, data=body, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
        assert "Access-Control-Allow-Origin" not in r.headers
    with pytest.raises(websockets.InvalidStatus) as refused:
        asyncio.run(_connect(server, STRANGER))
    assert refused.value.response.status_code == 403
    assert requests.get(server.http + "/v1/stats", headers=KEY, timeout=30).json()["total_tokens"] == before


def test_a_listed_page_opens_a_websocket_and_a_malformed_origin_is_only_refused(server):
    assert asyncio.run(_connect(server, PAGE)) == PAGE
    assert asyncio.run(_connect(server, PAGE.upper() + "/")) == PAGE.upper() + "/"  # (origins have no case)
    for origin in ("http://[", "null", server.http.rsplit(":", 1)[0] + ":1"):  # not listed, not its own: refused
        r = requests.get(server.http + "/v1/voices", headers={**KEY, "Origin": origin}, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", origin


def test_a_json_route_takes_only_a_json_body(server):
    """What a page can send cross-origin without a preflight (text/plain, a form) is never read as JSON."""
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = requests.post(server.http + SPEECH, headers={**KEY, "Content-Type": ctype, "Origin": PAGE},
                          data='{"input": "hi"}', timeout=30)
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", ctype
        assert r.headers["Access-Control-Allow-Origin"] == PAGE


async def _connect(srv, origin: str) -> str | None:
    url = srv.http.replace("http://", "ws://") + "/v1/audio/stream"
    async with websockets.connect(url, origin=origin, additional_headers=KEY) as ws:
        return ws.response.headers.get("Access-Control-Allow-Origin")


def test_a_page_the_server_served_itself_reaches_it_on_a_keyed_server_under_any_name(server):
    """Its own origin (the playground's): a rebinding page under another name has no key."""
    port = server.http.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"tts.example.org:{port}"):
        own = {"Host": host, "Origin": f"http://{host}"}
        r = requests.post(server.http + "/v1/auth/tokens", headers={**KEY, **own}, json={}, timeout=30)
        assert r.status_code == 201, (host, r.text)
        assert "Access-Control-Allow-Origin" not in r.headers  # (same-origin: nothing to allow)
        assert requests.get(server.http + "/v1/voices", headers=own, timeout=30).status_code == 401  # no key
        assert handshake(server, {**KEY, **own}).status_code == 101
    assert asyncio.run(_connect(server, server.http)) is None  # a real client's handshake too


@pytest.fixture(scope="module")
def keyless():
    with serve_in_process() as srv:
        yield srv


def test_a_page_the_keyless_server_served_reaches_it_only_at_an_address_or_localhost(keyless):
    """On a keyless server its own origin is trusted only where DNS rebinding cannot forge it: an
    attacker's page under its own name, pointed at this server, sends that name as Host and Origin."""
    port = keyless.http.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "127.0.0.1"):
        own = {"Host": host, "Origin": f"http://{host}"}
        r = requests.post(keyless.http + SPEECH, headers=own, timeout=60,
                          json={"input": "My own page.", "response_format": "pcm", "max_tokens": 14})
        assert r.status_code == 200 and r.content, (host, r.text)
        assert handshake(keyless, own).status_code == 101
    before = keyless.stats()["total_tokens"]
    rebound = f"evil.example:{port}"
    for headers in ({"Host": rebound, "Origin": f"http://{rebound}"},  # DNS rebinding: refused
                    {"Host": f"127.0.0.1:{port}", "Origin": "http://127.0.0.1:1"},  # another port: another origin
                    {"Host": f"127.0.0.1:{port}", "Origin": f"https://127.0.0.1:{port}"}):  # another scheme
        for r in (requests.post(keyless.http + SPEECH, headers={**headers, "Content-Type": "text/plain"},
                                data='{"input": "Spend their capacity."}', timeout=30),
                  handshake(keyless, headers)):
            assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", headers
    assert keyless.stats()["total_tokens"] == before  # no work done


def test_a_rebinding_pages_reads_of_a_keyless_server_are_refused_but_not_other_clients(keyless):
    """A same-origin GET sends no Origin: a browser's (Sec-Fetch-Site) read of /v1/ under an unlisted
    name is refused on a keyless server; at its address, or from a client that is no browser, it is served."""
    port = keyless.http.rsplit(":", 1)[1]
    browser = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
    for path in ("/v1/voices", "/v1/audio/voice_consents"):
        r = requests.get(keyless.http + path, timeout=30, headers={"Host": f"evil.example:{port}", **browser})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", path
        assert requests.get(keyless.http + path, timeout=30,
                            headers={"Host": f"127.0.0.1:{port}", **browser}).status_code == 200
        assert requests.get(keyless.http + path, timeout=30,  # a script or server: no Sec-Fetch headers
                            headers={"Host": f"tts.internal:{port}"}).status_code == 200
    page = requests.get(keyless.http + "/", timeout=30, headers={"Host": f"evil.example:{port}", **browser})
    assert page.status_code == 200  # the page itself is no data: only the API is closed to it


def handshake(srv, headers: dict) -> requests.Response:
    """A WebSocket handshake with ``headers`` (Host among them, which a WebSocket client sets itself)."""
    r = requests.get(srv.http + "/v1/audio/stream", timeout=30, stream=True, headers={
        "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", **headers})
    if r.status_code == 101:
        r.close()  # (the socket is not used)
    return r


@pytest.mark.parametrize("overrides, message", [
    (["server.cors_origins=[app.example.com]"], "scheme://host[:port]"),
    (["server.cors_origins=[https://app.example.com/page]"], "scheme://host[:port]"),
    (["server.cors_origins=['*']", "server.api_key=k"], "not allowed with API keys"),
])
def test_a_bad_allow_list_is_refused_at_start(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(None, overrides)


def test_every_origin_on_a_keyless_server_works_and_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="lyre.http"), serve_in_process("server.cors_origins=['*']") as srv:
        r = preflight(srv, SPEECH, STRANGER)
        assert r.status_code == 204 and r.headers["Access-Control-Allow-Origin"] == STRANGER
    assert any("any web page can make this server synthesize" in rec.message for rec in caplog.records)
