"""Two replicas behind a real HAProxy (deploy/compose/haproxy.cfg): requests spread by least
connections; a full replica gets no new sessions while the other has room; a draining replica's
streams finish while new ones go to the other, with no failed request; WebSocket contexts and the
gRPC bidirectional stream work through the balancer; a replica killed mid-stream cuts only its own
clients, cleanly, and the balancer stops sending to it. (Two CPU replicas share two cores here:
this proves routing, drain and shared state, not throughput.)"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import grpc
import pytest
import requests
import websockets

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support import haproxy
from tests.support.paths import REPO_ROOT
from tests.support.postgres import fresh_schema
from tests.support.servers import start_server, stop_server
from tests.support.voices import enroll

SPEECH = "/v1/audio/speech"
LONG = {"response_format": "pcm", "max_tokens": 2000, "min_tokens": 2000}  # ~24 s of audio: a held stream


SLOTS = (1, 3)  # lyre1 fills with one stream; lyre2 never fills with one request after another


@pytest.fixture
def cluster(postgres):
    url = fresh_schema(postgres.url)
    replicas, balancer = [], None
    try:
        for slots in SLOTS:  # one CPU thread each for the engine and the codec (2 cores here)
            replicas.append(start_server(
                f"voices.database_url={url}", f"scheduler.max_concurrent_sessions={slots}",
                f"scheduler.max_batch_size={slots}", "scheduler.max_pending=0", "scheduler.reserved_slots=0",
                "server.drain_timeout_s=60", "server.drain_notice_s=1", "server.trusted_proxies=[127.0.0.1]",
                "kv_cache.max_seq_len=4096", "model.cpu_threads=1", "codec.cpu_threads=1"))
        balancer = haproxy.start([(f"lyre{i + 1}", int(r.http.rsplit(":", 1)[1]), int(r.grpc.rsplit(":", 1)[1]))
                                  for i, r in enumerate(replicas)], maxconn=list(SLOTS))
        yield balancer, replicas
    finally:
        if balancer is not None:
            balancer.stop()
        for r in replicas:
            if r.proc.poll() is None:
                stop_server(r)


def sessions(replica) -> int:
    return requests.get(replica.http + "/v1/stats", timeout=10).json()["scheduler"]["total_sessions"]


def active(replica) -> int:
    return requests.get(replica.http + "/v1/stats", timeout=10).json()["scheduler"]["active_sessions"]


def hold(url: str) -> tuple[requests.Response, object]:
    """A long stream from ``url`` (the balancer's or a replica's), its first bytes read (the iterator
    is kept: dropping it would close the connection, and a closed connection cancels the synthesis)."""
    r = requests.post(url + SPEECH, json={"input": "A long answer.", **LONG}, stream=True, timeout=120)
    chunks = r.iter_content(4096)
    assert r.status_code == 200 and next(chunks)
    return r, chunks


def test_requests_spread_and_a_full_replica_gets_no_new_sessions(cluster):
    balancer, (small, large) = cluster
    for i in range(4):
        r = requests.post(balancer.http + SPEECH, json={"input": f"Short one {i}.", "response_format": "pcm"},
                          timeout=60)
        assert r.status_code == 200
    assert sessions(small) >= 1 and sessions(large) >= 1  # both served
    held, chunks = hold(small.http)  # lyre1's only slot taken
    balancer.wait_status("lyre1", "DOWN")  # its /ready says full
    before = sessions(small), sessions(large)
    for i in range(3):  # no 429 while the other has room: every one goes there
        r = requests.post(balancer.http + SPEECH, json={"input": f"Elsewhere {i}.", "response_format": "pcm"},
                          timeout=60)
        assert r.status_code == 200, r.text
    assert (sessions(small), sessions(large)) == (before[0], before[1] + 3)
    held.close()


def test_draining_a_replica_finishes_its_streams_and_sends_new_ones_to_the_other(cluster):
    balancer, replicas = cluster
    held, chunks = hold(balancer.http)
    draining = next(r for r in replicas if active(r) == 1)
    name = f"lyre{replicas.index(draining) + 1}"
    draining.proc.send_signal(signal.SIGTERM)
    with grpc.insecure_channel(balancer.grpc) as channel:  # at once: during the drain's notice, or elsewhere
        reply = tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(tts_pb2.SynthesizeRequest(text="Right away."),
                                                                  timeout=60)
        assert len(reply.audio) > 0
    balancer.wait_status(name, "DOWN")  # its /ready said no
    for i in range(3):
        r = requests.post(balancer.http + SPEECH, json={"input": f"New caller {i}.", "response_format": "pcm"},
                          timeout=60)
        assert r.status_code == 200, r.text
    got = sum(len(c) for c in chunks) + 4096
    assert got >= 2000 // 7 * 2048 * 2  # the held stream finished, every frame of it
    assert draining.proc.wait(timeout=60) == 0


def test_websocket_contexts_and_the_grpc_bidirectional_stream_work_through_the_balancer(cluster):
    balancer, _ = cluster

    async def ws():
        url = balancer.http.replace("http://", "ws://") + "/v1/audio/stream"
        audio = {"a": 0, "b": 0}
        async with websockets.connect(url) as sock:
            for cid in ("a", "b"):  # one after the other (one slot a replica here)
                await sock.send(json.dumps({"context_id": cid, "append": f"Context {cid} speaks. "}))
                await sock.send(json.dumps({"context_id": cid, "end": True}))
                async for message in sock:
                    m = json.loads(message)
                    assert "error" not in m, m
                    if m.get("type") == "audio":
                        audio[m["context_id"]] += 1
                    elif m.get("done"):
                        break
        return audio

    audio = asyncio.run(asyncio.wait_for(ws(), 120))
    assert audio["a"] > 0 and audio["b"] > 0
    with grpc.insecure_channel(balancer.grpc) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        chunks = list(stub.StreamingSynthesize(iter([
            tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.StreamingConfig()),
            tts_pb2.StreamingSynthesizeRequest(text="Through the balancer, by gRPC. "),
            tts_pb2.StreamingSynthesizeRequest(text="A second sentence.")]), timeout=120))
        assert chunks[-1].final and sum(len(c.audio) for c in chunks) > 0 and chunks[-1].metrics.pieces >= 1


def test_a_replica_killed_mid_stream_cuts_only_its_clients_cleanly(cluster, postgres):
    balancer, replicas = cluster
    assert enroll(replicas[0], "Survivor").status_code == 201  # written whole before the kill
    held, chunks = hold(balancer.http)
    victim = next(r for r in replicas if active(r) == 1)
    victim.proc.kill()  # SIGKILL: no drain, no goodbye
    with pytest.raises(requests.exceptions.RequestException):  # a cut body, not a short file passed as whole
        for _ in chunks:
            pass
    balancer.wait_status(f"lyre{replicas.index(victim) + 1}", "DOWN")
    survivor = next(r for r in replicas if r is not victim)
    for i in range(2):
        r = requests.post(balancer.http + SPEECH, json={"input": f"After the crash {i}.", "response_format": "pcm"},
                          timeout=60)
        assert r.status_code == 200
    voices = requests.get(balancer.http + "/v1/voices", timeout=10).json()["voices"]
    assert [v["name"] for v in voices if v["type"] == "cloned"] == ["Survivor"]  # whole, and seen by the survivor
    assert requests.get(survivor.http + "/ready", timeout=10).status_code == 200


def test_the_benchmark_reports_the_load_of_each_replica_behind_the_balancer(cluster, tmp_path):
    balancer, replicas = cluster
    out = tmp_path / "spread.json"
    run = subprocess.run([sys.executable, "benchmark.py", "--mode", "scaling", "--levels", "1", "--requests", "6",
                          "--protocol", "rest", "--url", balancer.http,
                          "--replica-urls", ",".join(r.http for r in replicas), "--output", str(out)],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    level = json.loads(out.read_text())["engines"]["lyre"]["levels"][0]
    spread = {r["url"]: r for r in level["replicas"]}
    assert set(spread) == {r.http for r in replicas}
    ok = round(level["success_rate"] * level["requests"])
    assert sum(r["sessions"] for r in spread.values()) == ok and all(r["sessions"] > 0 for r in spread.values())
    assert level["server_tokens_per_s"] > 0  # summed over the replicas, not one replica's
    assert "per replica:" in run.stdout
