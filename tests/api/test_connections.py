"""The connection layer holds under abuse: half-sent requests are cut after server.header_timeout_s
(the first request's from accept, a kept-alive connection's next one from its first byte), a body
that stalls is cut by the minimum rate and frees what it held, while a slow but honest upload
passes; one address may hold only max_connections_per_client connections from accept, everyone
only max_connections, and past a cap a connection is closed at once and counted. Each test waits
for the server's close (EOF or reset), never for a fixed time."""

from __future__ import annotations

import socket
import time

import pytest
import requests

from lyre.api.connections import BACKLOG, connection_caps, per_client_cap
from tests.support.audio_files import audio_file, speechlike
from tests.support.servers import serve_in_process
from tests.support.sockets import CLOSED_WITHIN_S, until_closed
from tests.support.waiting import until


@pytest.fixture(scope="module")
def guarded(demo_dir):
    # max_connections 8: 6 places on the REST port (the rest are gRPC's); one address may hold at most
    # half of them, 3, whatever max_connections_per_client says
    with serve_in_process("server.header_timeout_s=0.5", "server.body_min_bytes_per_s=1000",
                          "server.max_connections_per_client=100", "server.max_connections=8") as s:
        yield s
        assert s.stop() == 0


def connect(server, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", int(server.http.rsplit(":", 1)[1])), timeout=CLOSED_WITHIN_S,
                                    source_address=(source, 0))
    return sock


def websocket(server, source: str = "127.0.0.1") -> socket.socket:
    """A connection held open by a complete request: an upgraded, idle WebSocket (server.ws_idle_timeout_s
    is minutes), so no header or body timeout can free its place while a test counts on it."""
    sock = connect(server, source)
    sock.sendall(b"GET /v1/audio/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 101"), reply
    return sock


def closed_by_server(sock: socket.socket) -> bytes:
    """Everything the server sent until it closed the connection (EOF or reset)."""
    with sock:
        return until_closed(sock)


def metric(server, name: str, reason: str) -> float:
    text = requests.get(server.http + "/metrics", timeout=30).text
    line = next((ln for ln in text.splitlines() if ln.startswith(f'{name}_total{{reason="{reason}"}}')), None)
    return float(line.split()[-1]) if line else 0.0


def test_half_sent_request_lines_are_cut_and_others_are_still_served(guarded):
    before = metric(guarded, "lyre_connections_cut", "header_timeout_s: no complete request headers in time")
    started = time.monotonic()
    half = [connect(guarded) for _ in range(2)]
    half[0].sendall(b"GET /v1/mod")  # and nothing more
    half[1].sendall(b"\r\n\r\nGET /v1/mod")  # blank lines first (which aiohttp skips) earn no time
    assert requests.get(guarded.http + "/health", timeout=30).status_code == 200  # meanwhile: served
    for sock in half:
        assert closed_by_server(sock) == b""  # cut, without an answer
    assert time.monotonic() - started >= 0.5  # not before the header timeout
    after = metric(guarded, "lyre_connections_cut", "header_timeout_s: no complete request headers in time")
    assert after - before == 2


def test_a_kept_alive_connections_next_request_has_its_own_header_timeout(guarded):
    sock = connect(guarded)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
        reply += sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200")
    sock.sendall(b"GET /hea")  # the next request, half sent
    assert closed_by_server(sock) == b""


def test_the_caps_leave_the_process_its_descriptors_and_no_address_every_place():
    assert connection_caps(0, 1_048_576) == (12288, 4096)  # at most MOST_CONNECTIONS
    http, grpc = connection_caps(0, 1024)
    assert http + grpc == 1024 - 256 - BACKLOG and grpc == (http + grpc) // 4
    assert connection_caps(8, 1024) == (6, 2)  # set: split, whatever the descriptors
    assert connection_caps(0, 256) == (48, 16)  # a tiny limit still serves someone
    assert per_client_cap(256, 12288) == 256 and per_client_cap(256, 48) == 24 and per_client_cap(256, 1) == 1
    assert per_client_cap(0, 48) == 0  # no per-address limit, if the operator says so


def test_one_address_holds_at_most_its_connections_counted_from_accept(guarded):
    guarded.connections_settled()
    held = [websocket(guarded) for _ in range(3)]
    refused = connect(guarded)
    assert closed_by_server(refused) == b""  # closed at once, before it sent anything
    other = requests.Session()  # another address (127.0.0.2) is not this one's business
    other.mount("http://", SourceAdapter("127.0.0.2"))
    assert other.get(guarded.http + "/health", timeout=30).status_code == 200
    for sock in held:
        sock.close()
    # the places come back once the server has seen the closes
    until(lambda: requests.get(guarded.http + "/health", timeout=30).status_code == 200,
          what="a connection from the first address to be taken again")
    assert metric(guarded, "lyre_connections_refused", "max_connections_per_client") >= 1


def test_past_the_servers_cap_new_connections_are_closed_at_once(guarded):
    # max_connections 8: 6 for the REST port (the rest is the gRPC port's), from 3 addresses
    guarded.connections_settled()
    held = [websocket(guarded, f"127.0.0.{2 + i // 2}") for i in range(6)]
    refused = connect(guarded, "127.0.0.9")
    assert closed_by_server(refused) == b""
    for sock in held:
        sock.close()
    assert metric(guarded, "lyre_connections_refused", "max_connections") >= 1


def test_a_stalled_body_is_cut_and_a_slow_honest_one_passes(guarded):
    wav = audio_file(speechlike(1.0, rate=16000), 16000, "wav")  # 32 kB
    stalled = connect(guarded)
    stalled.sendall(b"POST /v1/audio/verify HTTP/1.1\r\nHost: x\r\nContent-Type: audio/wav\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(wav) + wav[:100])
    assert closed_by_server(stalled) == b""  # far below body_min_bytes_per_s: cut

    def slowly():  # ~20x the minimum rate, in small pieces, over three times header_timeout_s
        for i in range(0, len(wav), 2000):
            yield wav[i:i + 2000]
            time.sleep(0.1)

    r = requests.post(guarded.http + "/v1/audio/verify", data=slowly(), headers={"Content-Type": "audio/wav"},
                      timeout=120)
    assert r.status_code == 200 and r.json()["watermarked"] is False


class SourceAdapter(requests.adapters.HTTPAdapter):
    """requests from another loopback address."""

    def __init__(self, source: str):
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.source, 0)
        super().init_poolmanager(*args, **kwargs)
