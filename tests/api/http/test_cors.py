"""Browsers (CORS): pages on ``server.cors_origins`` may call it, their
preflights are answered without a key, their answers (errors and streams too) name the origin and
expose the headers a page reads; any other page is refused before any work, its "simple"
``text/plain`` POST and its WebSocket handshake included. Real requests and a real WebSocket
client against a real server, sending what a browser sends."""

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
    for origin in ("http://[", "null", server.http):  # not listed (the server's own address neither): refused
        r = requests.get(server.http + "/v1/voices", headers={**KEY, "Origin": origin}, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", origin


def test_a_json_route_takes_only_a_json_body(server):
    """What a page can send cross-origin without a preflight (text/plain, a form) is never read as JSON."""
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = requests.post(server.http + SPEECH, headers={**KEY, "Content-Type": ctype, "Origin": PAGE},
                          data='{"input": "hi"}', timeout=30)
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", ctype
        assert r.headers["Access-Control-Allow-Origin"] == PAGE


async def _connect(srv, origin: str) -> str:
    url = srv.http.replace("http://", "ws://") + "/v1/audio/stream"
    async with websockets.connect(url, origin=origin, additional_headers=KEY) as ws:
        return ws.response.headers["Access-Control-Allow-Origin"]


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
