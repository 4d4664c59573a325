"""client.py over each protocol; API-key auth; graceful shutdown that lets streams finish, and cancels
those that outlast server.drain_timeout_s; a bad config stops the start with a message. (Servers
in-process, stopped by the drain SIGTERM begins; tests/server/test_drain.py sends the signal.)"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import io
import re
import subprocess
import sys
from dataclasses import dataclass

import aiohttp
import grpc
import pytest
import soundfile as sf

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.paths import REPO_ROOT
from tests.support.servers import HOLD_SETTINGS, SECONDS, HeldCall, HeldStream, free_port, serve_in_process


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def client(*args: str, process: bool = False) -> Run:
    """client.py with ``args``: its main() called here (``process``: run as the script it is)."""
    if process:
        run = subprocess.run([sys.executable, "client.py", *args], capture_output=True, text=True, cwd=REPO_ROOT,
                             timeout=300)
        return Run(run.returncode, run.stdout, run.stderr)
    spec = importlib.util.spec_from_file_location("lyre_client_script", REPO_ROOT / "client.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = script.main(list(args))
    return Run(code, out.getvalue(), err.getvalue())


@pytest.mark.parametrize("protocol, fmt, suffix, process", [
    pytest.param("rest", "wav", "wav", True, id="rest-wav-script"),  # (once as the script itself)
    pytest.param("rest", "mp3", "mp3", False, id="rest-mp3"), pytest.param("ws", "wav", "wav", False, id="ws-wav"),
    pytest.param("grpc", "wav", "wav", False, id="grpc-wav"),
    pytest.param("grpc", "mulaw", "ulaw", False, id="grpc-mulaw")])
def test_client_saves_audio_and_reports_timing(server, tmp_path, protocol, fmt, suffix, process):
    out = tmp_path / f"test.{suffix}"
    url = server.grpc if protocol == "grpc" else server.http
    run = client("--text", "Hello world", "--output", str(out), "--protocol", protocol, "--url", url, process=process)
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
    with serve_in_process("server.api_key=s3cret", "server.drain_timeout_s=120") as srv:
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
                srv.terminate()  # what SIGTERM begins, mid-stream
                rest = await r.read()
            return denied, allowed, info.value.code(), len(voices.voices), health, len(first) + len(rest)

        denied, allowed, grpc_code, n_voices, health, streamed = asyncio.run(go())
        assert denied == (401, "unauthorized") and allowed == (200, 4 * 2048 * 2)
        assert grpc_code == grpc.StatusCode.UNAUTHENTICATED and n_voices == 8
        assert health[0] == 200  # /health needs no key
        assert streamed == 20 * 2048 * 2  # every frame of the in-flight stream arrived
        assert srv.wait() == 0
        assert "draining 1 in-flight request" in srv.log()


def test_shutdown_cancels_streams_that_outlast_the_drain_timeout():
    # the stream is held by backpressure (its client reads nothing), so it cannot end by itself first
    with serve_in_process("server.drain_timeout_s=0", *HOLD_SETTINGS) as srv:
        with HeldCall(srv.grpc) as held:  # (gRPC: its status tells how it ended)
            srv.terminate()
            with pytest.raises(grpc.RpcError) as cut:
                held.read_to_end()
        assert cut.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        assert srv.wait() == 0
        assert "drain timeout: cancelling 1 stream(s)" in srv.log()


def test_bad_startup_config_exits_with_a_message():
    run = subprocess.run([sys.executable, "production_server.py", "--set", "scheduler.max_batch_size=0"],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert run.returncode == 1 and "scheduler.max_batch_size" in run.stderr and "must be >= 1" in run.stderr


def test_overload_is_429_with_retry_after_and_resource_exhausted_over_grpc():
    with serve_in_process("scheduler.max_concurrent_sessions=1", "scheduler.max_batch_size=1",
                          "scheduler.max_pending=0", *HOLD_SETTINGS) as srv:
        with HeldStream(srv):  # the only slot is taken

            async def go():
                async with aiohttp.ClientSession() as s:
                    r = await s.post(srv.http + "/v1/audio/speech", json={"input": "me too"})
                    rest = (r.status, r.headers.get("Retry-After"), (await r.json())["error"]["code"])
                async with grpc.aio.insecure_channel(srv.grpc) as channel:
                    stub = tts_pb2_grpc.TextToSpeechStub(channel)
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await stub.Synthesize(tts_pb2.SynthesizeRequest(text="me too"))
                return rest, info.value.code()

            rest, grpc_code = asyncio.run(go())
        assert rest[0] == 429 and int(rest[1]) >= 1 and rest[2] == "overloaded"
        assert grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert srv.eventually_idle()["kv_cache"]["free_slots"] == 1
