"""Every synthesis on every protocol leaves its audit row on the real server (read back with
``lyre audit export``, called in-process: tests/trust/test_audit.py runs the command itself)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import grpc
import websockets
from openai import OpenAI
from riva.client.proto import riva_tts_pb2, riva_tts_pb2_grpc

from lyre import cli
from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.paths import CONFIG_PATH
from tests.support.waiting import until


def exported(server, out: Path) -> list[dict]:
    assert cli.main(["audit", "export", "--config", str(CONFIG_PATH), "--set", f"data_dir={server.data_dir}",
                     "--since", datetime.now(timezone.utc).date().isoformat(), "--format", "jsonl",
                     "--output", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_one_row_per_synthesis_on_every_protocol(server, tmp_path):
    texts = {p: f"Audited over {p}, {time.time_ns()}." for p in ("rest", "ws", "grpc", "riva", "grpc-stream")}
    pcm = OpenAI(base_url=server.http + "/v1", api_key="unused").audio.speech.create(
        model="tts-1", voice="nova", input=texts["rest"], response_format="pcm").content

    async def ws():
        url = server.http.replace("http://", "ws://") + "/v1/audio/stream"
        async with websockets.connect(url) as sock:
            await sock.send(json.dumps({"text": texts["ws"], "voice": "zac"}))
            async for message in sock:
                if isinstance(message, str) and json.loads(message).get("done"):
                    return

    asyncio.run(ws())
    with grpc.insecure_channel(server.grpc) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        stub.Synthesize(tts_pb2.SynthesizeRequest(text=texts["grpc"], voice="dan"))
        list(stub.StreamingSynthesize(iter([tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.StreamingConfig()),
                                            tts_pb2.StreamingSynthesizeRequest(text=texts["grpc-stream"])])))
        riva_tts_pb2_grpc.RivaSpeechSynthesisStub(channel).Synthesize(riva_tts_pb2.SynthesizeSpeechRequest(
            text=texts["riva"], voice_name="English-US.Male-1", encoding=1, sample_rate_hz=16000))
    hashes = {hashlib.sha256(t.encode()).hexdigest(): p for p, t in texts.items()}

    def these() -> list[dict]:  # (written off the event loop, as each synthesis ends)
        rows = [r for r in exported(server, tmp_path / "audit.jsonl")  # (each ended: its row completed)
                if r["text_sha256"] in hashes and r["outcome"] != "started"]
        return rows if len(rows) >= len(texts) else []

    mine = until(these, what="an audit row for each synthesis")
    by = {hashes[r["text_sha256"]]: r for r in mine}
    assert len(mine) == len(texts)
    assert {p: (r["protocol"], r["voice"], r["outcome"]) for p, r in by.items()} == {
        "rest": ("rest", "mia", "completed"), "ws": ("ws", "zac", "completed"), "grpc": ("grpc", "dan", "completed"),
        "grpc-stream": ("grpc", "tara", "completed"), "riva": ("riva", "leo", "completed")}
    assert by["rest"]["pcm_sha256"] == hashlib.sha256(pcm).hexdigest()  # 24 kHz pcm: exactly what was sent
    assert all(r["account"] == "default" and r["audio_seconds"] > 0 for r in mine)
    # how each generation stopped (the test servers' min_tokens = max_tokens: always the cap)
    assert {r["reason"] for r in mine} == {"length"}


def test_a_synthesis_cut_by_sigkill_has_its_row_and_it_is_closed_as_interrupted_at_the_next_start(demo_dir):
    """The row is written before the first audio: a server killed mid-synthesis leaves it open
    (outcome started), and its next start closes it as interrupted."""
    import requests
    import sqlalchemy as sa

    from lyre.storage.db import audit, default_url, open_database
    from tests.support.servers import restart_server, start_server

    srv = start_server("sampling.max_tokens=700", "sampling.min_tokens=700")
    try:
        with requests.post(srv.http + "/v1/audio/speech", json={"input": "Cut me off.", "voice": "tara",
                                                                 "response_format": "pcm"}, stream=True, timeout=60) as r:
            assert r.status_code == 200 and next(r.iter_content(4096))  # its first audio came
            srv.proc.kill()
            srv.proc.wait()
    finally:
        if srv.running:
            srv.proc.kill()
    engine = open_database(default_url(srv.data_dir))

    def outcomes() -> list[tuple[str, str]]:
        with engine.connect() as c:
            return [(r.outcome, r.reason) for r in c.execute(sa.select(audit.c.outcome, audit.c.reason))]

    assert outcomes() == [("started", "")]
    again = restart_server(srv)
    try:
        until(lambda: outcomes() != [("started", "")], what="the open row to be closed")
        assert outcomes() == [("interrupted", "the server stopped before the synthesis ended")]
    finally:
        assert again.stop() == 0
