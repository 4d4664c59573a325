"""The edge's limits in deploy/compose/haproxy.cfg, run by a real HAProxy: a request that never
finishes arriving is cut by ``timeout http-request`` (either port, even a connection that sends
nothing), an idle keep-alive connection by ``timeout http-keep-alive``; an address past its open
connections is refused at once while another address gets through; an address or an API key past
its request rate, or a key past its requests in flight, gets 429 with Retry-After (gRPC:
RESOURCE_EXHAUSTED with retry-after) while another address or key still gets through; the key is
counted by its hash, never held in the clear; HAProxy never runs with fewer descriptors than its
maxconn needs; the shipped numbers serve a busy office behind one address. And statically: the
Kubernetes balancer carries the same protections as compose.

The replica behind the balancer is a stand-in (an HTTP server and a gRPC server on loopback): these
tests are about what HAProxy lets through, not about Lyre (tests/deploy/test_balancer.py runs real
replicas behind the same file). Each test starts its own HAProxy with small limits (through the
file's ``LYRE_EDGE_*`` variables or a replaced directive), so that a limit is reached in a few
requests; a second source address is 127.0.0.2 (all of 127/8 is loopback on Linux)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import http.client
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
import yaml

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support import haproxy
from tests.support.paths import REPO_ROOT
from tests.support.sockets import until_closed
from tests.support.waiting import until

COMPOSE_CFG = REPO_ROOT / "deploy" / "compose" / "haproxy.cfg"
BALANCER_YAML = REPO_ROOT / "deploy" / "kubernetes" / "balancer.yaml"
OTHER = "127.0.0.2"  # another client's address
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # what every HTTP/2 (gRPC) connection starts with
# a test's counting window: long enough that a loaded machine cannot let a rate decay mid-test
SLOW_WINDOW = {"http_req_rate(10s)": "http_req_rate(600s)"}
BOUND_S = 60.0  # for a stuck system, never a measurement


class Replica:
    """A stand-in replica: ``/ready`` and every other path answer 200 at once, except ``/hold``,
    which waits until :meth:`release`; gRPC ``Synthesize`` answers b"ok"."""

    def __init__(self):
        self.held = 0
        self.arrived = threading.Condition()
        self.released = threading.Event()
        replica = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as HAProxy reuses its connections

            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/hold":
                    with replica.arrived:
                        replica.held += 1
                        replica.arrived.notify_all()
                    replica.released.wait(BOUND_S)
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Speech(tts_pb2_grpc.TextToSpeechServicer):
            def Synthesize(self, request, context):
                return tts_pb2.SynthesizeResponse(audio=b"ok")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # (HAProxy closes its idle connections when it stops)

        self.http = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, name="stand-in-http", daemon=True).start()
        self.grpc = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
        tts_pb2_grpc.add_TextToSpeechServicer_to_server(Speech(), self.grpc)
        self.grpc_port = self.grpc.add_insecure_port("127.0.0.1:0")
        self.grpc.start()

    def wait_held(self, n: int) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: self.held >= n, BOUND_S), f"{self.held} of {n} requests held"

    def release(self) -> None:
        self.released.set()

    def stop(self) -> None:
        self.released.set()
        self.http.shutdown()
        self.http.server_close()
        self.grpc.stop(None)


@pytest.fixture(scope="module")
def replica():
    r = Replica()
    yield r
    r.stop()


@pytest.fixture
def edge(replica):
    """``edge(env=..., replace=...)``: HAProxy with the shipped file in front of the stand-in (stopped
    after the test)."""
    started = []

    def start(**options) -> haproxy.Balancer:
        started.append(haproxy.start([("lyre1", replica.http.server_port, replica.grpc_port)], [50], **options))
        return started[-1]

    yield start
    for balancer in started:
        balancer.stop()


def connection(balancer: haproxy.Balancer, source: str = "127.0.0.1") -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", balancer.ports[0], timeout=BOUND_S, source_address=(source, 0))


def get(balancer: haproxy.Balancer, path: str = "/v1/voices", key: str | None = None, source: str = "127.0.0.1",
        conn: http.client.HTTPConnection | None = None) -> http.client.HTTPResponse:
    """One request (on ``conn``, kept open, or on a new connection, closed); the response, read."""
    c = conn or connection(balancer, source)
    c.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
    response = c.getresponse()
    response.body = response.read()
    if conn is None:
        c.close()
    return response


def synthesize(balancer: haproxy.Balancer, key: str | None = None) -> grpc.StatusCode:
    """A gRPC call through the balancer; its status (retry-after checked when refused)."""
    with grpc.insecure_channel(balancer.grpc) as channel:
        try:
            reply = tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(
                tts_pb2.SynthesizeRequest(text="Hello."), timeout=BOUND_S,
                metadata=(("authorization", f"Bearer {key}"),) if key else None)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                assert dict(e.trailing_metadata())["retry-after"].isdigit() and "retry after" in e.details()
            return e.code()
    assert reply.audio == b"ok"
    return grpc.StatusCode.OK


def refused(response: http.client.HTTPResponse, retry_after: str) -> bool:
    """A 429 from the edge: Retry-After, and Lyre's JSON error shape."""
    if response.status != 429:
        return False
    error = json.loads(response.body)["error"]
    assert response.getheader("Retry-After") == retry_after and error["type"] == "overloaded_error", error
    return True


def closed_at_once(port: int, source: str) -> bool:
    """Whether a new connection from ``source`` is closed without an answer to a whole request."""
    try:  # (the reset may come before connect() returns, or before the request is sent)
        with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S, source_address=(source, 0)) as s:
            s.sendall(b"GET /v1/voices HTTP/1.1\r\nHost: lyre\r\n\r\n")
            return s.recv(4096) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


# -- timeouts


@pytest.mark.parametrize("port, sent", [(0, b"POST /v1/audio/speech HT"), (1, PREFACE[:9]), (1, b"")],
                         ids=["http-half-request-line", "grpc-half-preface", "grpc-silent"])
def test_a_request_that_never_finishes_arriving_is_cut_at_the_http_request_timeout(edge, port, sent):
    balancer = edge(replace={"timeout http-request 10s": "timeout http-request 1s"})
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", balancer.ports[port]), timeout=BOUND_S) as s:
        s.sendall(sent)
        got = until_closed(s)  # (the close is the event waited for)
    took = time.monotonic() - started
    # cut by this timeout: not at once, and long before timeout client (300 s) would have
    assert 0.8 <= took < 30, took
    if port == 0:
        assert got.startswith(b"HTTP/1.1 408 "), got[:100]


def test_an_idle_keep_alive_connection_is_closed_at_the_keep_alive_timeout(edge):
    balancer = edge(replace={"timeout http-keep-alive 30s": "timeout http-keep-alive 1s"})
    c = connection(balancer)
    assert get(balancer, conn=c).status == 200
    done = time.monotonic()
    assert until_closed(c.sock) == b""
    assert 0.8 <= time.monotonic() - done < 30
    c.close()


# -- per address


def test_an_address_past_its_open_connections_is_refused_at_once_while_another_gets_through(edge):
    balancer = edge(env={"LYRE_EDGE_CONN_PER_ADDRESS": "3"},
                    replace={"timeout http-keep-alive 30s": "timeout http-keep-alive 300s"})  # held, not timed out
    held = [connection(balancer) for _ in range(3)]
    for c in held:  # answered: each counted before the next one opens
        assert get(balancer, conn=c).status == 200
    assert closed_at_once(balancer.ports[0], "127.0.0.1")
    assert closed_at_once(balancer.ports[1], "127.0.0.1")  # both ports count together
    assert get(balancer, source=OTHER).status == 200  # another address: served
    for c in held:  # (still open and usable)
        assert get(balancer, conn=c).status == 200
    held[0].close()  # a place frees up when one of them closes (HAProxy announces nothing: polled)
    until(lambda: not closed_at_once(balancer.ports[0], "127.0.0.1"), BOUND_S, "a place for 127.0.0.1")
    for c in held[1:]:
        c.close()


def test_an_address_past_its_request_rate_gets_429_on_both_ports_while_another_gets_through(edge):
    balancer = edge(env={"LYRE_EDGE_REQ_PER_ADDRESS": "3"}, replace=SLOW_WINDOW)
    assert [get(balancer).status for _ in range(3)] == [200] * 3
    assert refused(get(balancer), retry_after="10")
    assert synthesize(balancer) == grpc.StatusCode.RESOURCE_EXHAUSTED  # gRPC calls count, and are refused, too
    assert get(balancer, source=OTHER).status == 200
    assert get(balancer, key="another-key").status == 429  # a key does not lift an address's limit


# -- per API key


def test_a_key_past_its_request_rate_gets_429_while_another_key_gets_through(edge):
    balancer = edge(env={"LYRE_EDGE_REQ_PER_KEY": "3"}, replace=SLOW_WINDOW)
    assert [get(balancer, key="sk-first").status for _ in range(2)] == [200] * 2
    assert synthesize(balancer, key="sk-first") == grpc.StatusCode.OK  # both ports count together
    assert refused(get(balancer, key="sk-first"), retry_after="10")
    assert synthesize(balancer, key="sk-first") == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert get(balancer, key="sk-second").status == 200  # the same address, another key
    assert synthesize(balancer, key="sk-second") == grpc.StatusCode.OK
    assert get(balancer).status == 200  # no key: only the address's limits
    # the table holds the key's SHA-256, never the key
    table = balancer.command("show table edge_per_key")
    assert hashlib.sha256(b"Bearer sk-first").hexdigest() in table.lower()
    assert "sk-first" not in table and b"sk-first".hex() not in table.lower()


def test_a_key_past_its_requests_in_flight_gets_429_until_one_ends(edge, replica):
    balancer = edge(env={"LYRE_EDGE_IN_FLIGHT_PER_KEY": "2"})
    replica.released.clear()
    before = replica.held
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        streams = [pool.submit(get, balancer, "/hold", "sk-busy") for _ in range(2)]
        replica.wait_held(before + 2)  # both in flight
        assert refused(get(balancer, key="sk-busy"), retry_after="1")
        assert synthesize(balancer, key="sk-busy") == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert get(balancer, key="sk-calm").status == 200
        replica.release()
        assert [s.result(BOUND_S).status for s in streams] == [200, 200]
    until(lambda: get(balancer, key="sk-busy").status == 200, BOUND_S, "sk-busy served again")


# -- global


def test_haproxy_refuses_to_start_with_fewer_descriptors_than_its_maxconn_needs(edge):
    balancer = edge(nofile=1024)  # maxconn 4096 needs ~8,200
    assert balancer.wait_ended() != 0
    assert "Cannot raise FD limit" in "".join(balancer.log)


def test_a_busy_office_behind_one_address_and_one_key_is_served_with_the_shipped_limits(edge):
    """300 callers behind one NAT, each with its connection open, all with the office's key."""
    balancer = edge()
    callers = [connection(balancer) for _ in range(300)]
    try:
        assert [get(balancer, key="sk-office", conn=c).status for c in callers] == [200] * 300
        assert all(get(balancer, key="sk-office", conn=c).status == 200 for c in callers[:100])  # and again
    finally:
        for c in callers:
            c.close()


# -- the files, statically


def sections(cfg: str) -> dict[str, str]:
    """An HAProxy file's sections ("global", "defaults", "frontend lyre_http", ...): name -> lines."""
    found: dict[str, list[str]] = {}
    name = None
    for line in cfg.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            name = line.strip()
            found[name] = []
        elif name is not None and line.strip() and not line.lstrip().startswith("#"):
            found[name].append(line.strip())
    return {k: "\n".join(v) for k, v in found.items()}


def kubernetes_cfg() -> str:
    return next(d for d in yaml.safe_load_all(BALANCER_YAML.read_text())
                if d and d["kind"] == "ConfigMap")["data"]["haproxy.cfg"]


PROTECTION = ("global", "defaults", "frontend lyre_http", "frontend lyre_grpc",
              "backend edge_per_address", "backend edge_per_key")


def test_compose_and_kubernetes_carry_the_same_edge_protections():
    compose, cluster = sections(COMPOSE_CFG.read_text()), sections(kubernetes_cfg())
    for name in PROTECTION:
        assert compose[name] == cluster[name], name
    defaults = compose["defaults"]
    for directive in ("timeout http-request 10s", "timeout http-keep-alive", "timeout client", "timeout tunnel"):
        assert directive in defaults
    for frontend in ("frontend lyre_http", "frontend lyre_grpc"):
        rules = compose[frontend]
        assert "track-sc0 src,ipmask(32,64) table edge_per_address" in rules
        assert "tcp-request connection reject if { sc0_conn_cur gt" in rules
        assert "track-sc1 req.hdr(authorization),sha2(256) table edge_per_key" in rules
        for counter in ("sc0_http_req_rate", "sc1_http_req_rate", "sc1_conn_cur"):
            assert re.search(rf"http-request (deny deny_status 429|return status 200 hdr grpc-status 8) .*"
                             rf"(Retry-After|retry-after) \d+ if {{ {counter} gt", rules), (frontend, counter)
    global_ = compose["global"]
    limits = dict(re.findall(r"presetenv (LYRE_EDGE_\w+) (\d+)", global_))
    assert set(limits) == {"LYRE_EDGE_CONN_PER_ADDRESS", "LYRE_EDGE_REQ_PER_ADDRESS", "LYRE_EDGE_REQ_PER_KEY",
                           "LYRE_EDGE_IN_FLIGHT_PER_KEY"}
    for name in limits:  # each one used
        assert f'"${{{name}}}"' in compose["frontend lyre_http"] and f'"${{{name}}}"' in compose["frontend lyre_grpc"]
    maxconn = int(re.search(r"^maxconn (\d+)$", global_, re.M)[1])
    assert int(limits["LYRE_EDGE_CONN_PER_ADDRESS"]) <= maxconn // 4  # a few addresses cannot take the rest
