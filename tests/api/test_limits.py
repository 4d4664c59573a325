"""Limits a public server needs: idle sockets, connections per client address (shared by REST,
WebSocket and gRPC)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import grpc
import pytest
import websockets

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import serve_in_process
from tests.support.waiting import until_async
from tests.support.ws import until_done, ws_url


@pytest.fixture(scope="module")
def strict_server(demo_dir):
    with serve_in_process("server.ws_idle_timeout_s=0.5", "server.max_connections_per_client=2") as s:
        yield s
        assert s.stop() == 0


@pytest.fixture(scope="module")
def capped_server(demo_dir):
    with serve_in_process("server.max_connections_per_client=2") as s:
        yield s
        assert s.stop() == 0


def test_an_idle_socket_is_closed_but_a_speaking_one_is_not(strict_server):
    async def go():
        async with websockets.connect(ws_url(strict_server)) as idle:
            with pytest.raises(websockets.ConnectionClosed) as info:
                await idle.recv()  # nothing sent: closed after ws_idle_timeout_s
        async with websockets.connect(ws_url(strict_server)) as busy:
            # a context that speaks for longer than the idle timeout keeps its socket
            await busy.send(json.dumps({"text": "Keep going.", "max_tokens": 280, "min_tokens": 280}))
            audio, done = await until_done(busy)
        return info.value.rcvd, audio, done

    close, audio, done = asyncio.run(go())
    assert close.code == 1000 and "idle" in close.reason
    assert len(b"".join(audio)) == 40 * 2048 * 2 and done["done"]


def test_a_socket_whose_contexts_only_wait_for_text_is_closed_when_idle(strict_server):
    async def go():
        async with websockets.connect(ws_url(strict_server)) as ws:
            await ws.send(json.dumps({"context_id": "c", "append": "no sentence end, and then nothing"}))
            with pytest.raises(websockets.ConnectionClosed) as info:
                while True:
                    await ws.recv()
        return info.value.rcvd

    close = asyncio.run(go())
    assert close.code == 1000 and "idle" in close.reason


def test_one_client_address_may_hold_only_so_many_connections(capped_server):
    capped_server.connections_settled()

    async def go():
        sockets = [await websockets.connect(ws_url(capped_server)) for _ in range(2)]
        for ws in sockets:  # keep them from idling out: open contexts waiting for a sentence end
            await ws.send(json.dumps({"context_id": "c", "append": "waiting for more"}))
        with pytest.raises(aiohttp.ClientConnectionError) as rest:  # a third connection: closed at accept
            async with aiohttp.ClientSession() as s, s.post(capped_server.http + "/v1/audio/speech",
                                                            json={"input": "hi"}) as r:
                await r.read()
        async with grpc.aio.insecure_channel(capped_server.grpc) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(tts_pb2.SynthesizeRequest(text="hi"))
        await sockets[0].close()
        async with aiohttp.ClientSession() as s:  # a place is free again (once the server saw the close)
            async def admitted() -> tuple[int, int] | None:
                async with s.post(capped_server.http + "/v1/audio/speech",
                                  json={"input": "hi", "response_format": "pcm"}) as r:
                    return None if r.status == 429 else (r.status, len(await r.read()))

            after = await until_async(admitted, what="a place freed by the closed socket")
        await sockets[1].close()
        return rest, info.value, after

    rest, grpc_error, after = asyncio.run(go())
    assert rest.value is not None
    assert grpc_error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # gRPC counts calls: told why
    assert "server.max_connections_per_client is 2" in grpc_error.details()
    assert after == (200, 4 * 2048 * 2)
