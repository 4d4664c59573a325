"""Shutdown honours server.drain_timeout_s on every protocol: idle sockets close at once, streams
that outlast the timeout are cancelled with a clear last message, and the process exits 0."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import grpc
import websockets

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import start_server, stop_server
from tests.support.ws import ws_url

LONG = {"max_tokens": 900, "min_tokens": 900}


def test_sigterm_cancels_every_protocol_at_the_drain_timeout_and_exits():
    srv = start_server("server.drain_timeout_s=1")
    try:
        async def go():
            idle = await websockets.connect(ws_url(srv))
            busy = await websockets.connect(ws_url(srv))
            await busy.send(json.dumps({"context_id": "c", "text": "A long answer.", **LONG}))
            assert json.loads(await busy.recv())["type"] == "audio"
            session = aiohttp.ClientSession()
            rest = await session.post(srv.http + "/v1/audio/speech",
                                      json={"input": "A long answer.", "response_format": "pcm", **LONG})
            await rest.content.readany()
            channel = grpc.aio.insecure_channel(srv.grpc)
            call = tts_pb2_grpc.TextToSpeechStub(channel).SynthesizeStream(tts_pb2.SynthesizeRequest(
                text="A long answer.", sampling=tts_pb2.SamplingOptions(max_tokens=900)))
            await call.read()

            started = time.monotonic()
            srv.proc.terminate()
            # the idle socket is closed at once ("going away"), not kept until the timeout
            try:
                await idle.recv()
            except websockets.ConnectionClosed as e:
                idle_close = e.rcvd.code
            # the busy context is told why, then its socket closes
            last = None
            try:
                while True:
                    last = json.loads(await busy.recv())
            except websockets.ConnectionClosed as e:
                busy_close = e.rcvd.code
            try:
                await rest.read()
                rest_cut = False
            except aiohttp.ClientPayloadError:
                rest_cut = True
            try:
                while await call.read() != grpc.aio.EOF:
                    pass
                grpc_code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as e:
                grpc_code = e.code()
            await session.close()
            await channel.close()
            exit_code = await asyncio.to_thread(srv.proc.wait, 60)
            return idle_close, last, busy_close, rest_cut, grpc_code, exit_code, time.monotonic() - started

        idle_close, last, busy_close, rest_cut, grpc_code, exit_code, took = asyncio.run(go())
        assert idle_close == 1001 and busy_close == 1001
        assert last["context_id"] == "c" and "drain_timeout_s has passed" in last.get("error", {}).get("message", ""), last
        assert rest_cut  # the REST body ends short: an incomplete response, not a short file
        assert grpc_code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        assert exit_code == 0
        assert took < 30  # drain_timeout_s (1 s) + unwinding; it used to take 43-47 s
        log = srv.log()
        assert "drain timeout: cancelling 3 stream(s)" in log and "stopped" in log
        assert "A long answer" not in log  # request text never reaches the log
    finally:
        if srv.proc.poll() is None:
            stop_server(srv)
