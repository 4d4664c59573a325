"""client.py over each protocol; API-key auth; graceful shutdown that lets streams finish."""

from __future__ import annotations

import asyncio
import io
import re
import subprocess
import sys

import aiohttp
import grpc
import pytest
import soundfile as sf

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.paths import REPO_ROOT
from tests.support.servers import SECONDS, free_port, start_server, stop_server


def client(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "client.py", *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=300)


@pytest.mark.parametrize("protocol, fmt, suffix", [("rest", "wav", "wav"), ("rest", "mp3", "mp3"),
                                                    ("ws", "wav", "wav"), ("grpc", "wav", "wav"),
                                                    ("grpc", "mulaw", "ulaw")])
def test_client_saves_audio_and_reports_timing(server, tmp_path, protocol, fmt, suffix):
    out = tmp_path / f"test.{suffix}"
    url = server.grpc if protocol == "grpc" else server.http
    run = client("--text", "Hello world", "--output", str(out), "--protocol", protocol, "--url", url)
    assert run.returncode == 0, run.stderr
    reported = re.search(r"TTFB \d+ ms, audio ([\d.]+) s, real-time factor [\d.]+", run.stdout)
    assert reported, run.stdout
    assert abs(float(reported.group(1)) - SECONDS) <= (0.08 if fmt == "mp3" else 0.01)  # mp3 frames pad the end
    data = out.read_bytes()
    if fmt == "wav":
        audio, rate = sf.read(io.BytesIO(data), dtype="int16")
        assert abs(len(audio) / rate - SECONDS) < 1e-3
    elif fmt == "mulaw":
        assert abs(len(data) - SECONDS * 8000) <= 2


def test_client_says_clearly_when_the_server_is_unreachable_or_refuses(server, tmp_path):
    port = free_port()
    for protocol, url in (("rest", f"http://127.0.0.1:{port}"), ("ws", f"http://127.0.0.1:{port}"),
                          ("grpc", f"127.0.0.1:{port}")):
        run = client("--text", "hi", "--protocol", protocol, "--url", url, "--output", str(tmp_path / "x.wav"))
        assert run.returncode == 1 and "error: cannot" in run.stderr, (protocol, run.stderr)
    for protocol, url in (("rest", server.http), ("ws", server.http), ("grpc", server.grpc)):
        run = client("--text", "hi", "--voice", "bob", "--protocol", protocol, "--url", url,
                     "--output", str(tmp_path / "y.wav"))
        assert run.returncode == 1 and "unknown voice 'bob'" in run.stderr, (protocol, run.stderr)
    assert not (tmp_path / "y.wav").exists()


def test_api_key_is_required_when_configured_and_shutdown_drains(tmp_path):
    srv = start_server("server.api_key=s3cret", "server.drain_timeout_s=120")
    try:
        async def go():
            async with aiohttp.ClientSession() as s:
                r = await s.post(srv.http + "/v1/audio/speech", json={"input": "hi"})
                denied = (r.status, (await r.json())["error"]["code"])
                r = await s.post(srv.http + "/v1/audio/speech?api_key=s3cret", json={"input": "hi"})
                assert r.status == 401  # only the Authorization header carries the key (URLs end up in logs)
                r = await s.post(srv.http + "/v1/audio/speech", json={"input": "hi"},
                                 headers={"Authorization": "Bearer s3cre"})
                assert r.status == 401
                ok = await s.post(srv.http + "/v1/audio/speech", json={"input": "hi", "response_format": "pcm"},
                                  headers={"Authorization": "Bearer s3cret"})
                allowed = (ok.status, len(await ok.read()))
            async with grpc.aio.insecure_channel(srv.grpc) as channel:
                stub = tts_pb2_grpc.TextToSpeechStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.ListVoices(tts_pb2.ListVoicesRequest())
                voices = await stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=(("authorization", "Bearer s3cret"),))
            health = await asyncio.to_thread(srv.get, "/health")
            # A stream in flight when the server is told to stop still completes.
            async with aiohttp.ClientSession() as s:
                r = await s.post(srv.http + "/v1/audio/speech", headers={"Authorization": "Bearer s3cret"},
                                 json={"input": "finish me", "response_format": "pcm", "max_tokens": 140,
                                       "min_tokens": 140})
                first = await r.content.readany()
                srv.proc.terminate()  # SIGTERM mid-stream
                rest = await r.read()
            return denied, allowed, info.value.code(), len(voices.voices), health, len(first) + len(rest)

        denied, allowed, grpc_code, n_voices, health, streamed = asyncio.run(go())
        assert denied == (401, "unauthorized") and allowed == (200, 4 * 2048 * 2)
        assert grpc_code == grpc.StatusCode.UNAUTHENTICATED and n_voices == 8
        assert health[0] == 200  # /health needs no key
        assert streamed == 20 * 2048 * 2  # every frame of the in-flight stream arrived
        assert srv.proc.wait(timeout=120) == 0
        assert "draining 1 in-flight request" in srv.log() and "stopped" in srv.log()
    finally:
        if srv.proc.poll() is None:
            stop_server(srv)


def test_shutdown_cancels_streams_that_outlast_the_drain_timeout():
    srv = start_server("server.drain_timeout_s=0")

    async def go():
        async with aiohttp.ClientSession() as s:
            r = await s.post(srv.http + "/v1/audio/speech",
                             json={"input": "never ending", "response_format": "pcm", "max_tokens": 900})
            await r.content.readany()
            srv.proc.terminate()
            try:
                await r.read()
            except aiohttp.ClientPayloadError:
                pass  # the body is cut off: the stream was cancelled

    asyncio.run(go())
    assert srv.proc.wait(timeout=120) == 0
    assert "drain timeout: cancelling 1 stream(s)" in srv.log()


def test_bad_startup_config_exits_with_a_message():
    run = subprocess.run([sys.executable, "production_server.py", "--set", "scheduler.max_batch_size=0"],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert run.returncode == 1 and "scheduler.max_batch_size" in run.stderr and "must be >= 1" in run.stderr


def test_overload_is_429_with_retry_after_and_resource_exhausted_over_grpc():
    srv = start_server("scheduler.max_concurrent_sessions=1", "scheduler.max_batch_size=1",
                       "scheduler.max_pending=0")
    try:
        async def go():
            async with aiohttp.ClientSession() as s:
                busy = await s.post(srv.http + "/v1/audio/speech",
                                    json={"input": "hold the line", "response_format": "pcm", "max_tokens": 600})
                await busy.content.readany()  # the only slot is taken
                r = await s.post(srv.http + "/v1/audio/speech", json={"input": "me too"})
                rest = (r.status, r.headers.get("Retry-After"), (await r.json())["error"]["code"])
                async with grpc.aio.insecure_channel(srv.grpc) as channel:
                    stub = tts_pb2_grpc.TextToSpeechStub(channel)
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await stub.Synthesize(tts_pb2.SynthesizeRequest(text="me too"))
                busy.close()
            return rest, info.value.code()

        rest, grpc_code = asyncio.run(go())
        assert rest[0] == 429 and int(rest[1]) >= 1 and rest[2] == "overloaded"
        assert grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert srv.eventually_idle()["kv_cache"]["free_slots"] == 1
    finally:
        stop_server(srv)
