"""Shutdown honours server.drain_timeout_s on every protocol: idle sockets close at once, streams
that outlast the timeout are cancelled with a clear last message, and the process exits 0. (A real
process: the signal and the exit code are the point.)"""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import requests
import websockets

from tests.support.servers import (
    HELD_TOKENS,
    HOLD_SETTINGS,
    HeldCall,
    HeldStream,
    slow_socket,
    start_server,
    stop_server,
)
from tests.support.ws import ws_url

# Each stream is held by backpressure (tests/support/servers.py): its client reads its first audio,
# then nothing until the signal, so no stream can end before the drain timeout, however fast the
# machine, and the server does not generate meanwhile.
LONG = {"max_tokens": HELD_TOKENS, "min_tokens": HELD_TOKENS}


def cut_off(read) -> bool:
    """Whether reading a held stream to its end fails: a REST body cut short, a gRPC call ended
    UNAVAILABLE or CANCELLED (the drain's answers; anything else is raised)."""
    try:
        read()
        return False
    except requests.exceptions.ChunkedEncodingError:
        return True
    except grpc.RpcError as e:
        assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), e
        return True


def test_sigterm_cancels_every_protocol_at_the_drain_timeout_and_exits():
    srv = start_server("server.drain_timeout_s=1", *HOLD_SETTINGS)
    try:
        async def go():
            idle = await websockets.connect(ws_url(srv))
            busy = await websockets.connect(ws_url(srv), sock=slow_socket(srv.http), max_queue=1)
            await busy.send(json.dumps({"context_id": "c", "text": "A long answer.", **LONG}))
            assert json.loads(await busy.recv())["type"] == "audio"
            rest = await asyncio.to_thread(HeldStream, srv)
            call = await asyncio.to_thread(HeldCall, srv.grpc)

            started = time.monotonic()
            srv.terminate()  # SIGTERM
            # the idle socket is closed at once ("going away"), not kept until the timeout
            try:
                await idle.recv()
            except websockets.ConnectionClosed as e:
                idle_close = e.rcvd.code
            # the busy context is told why, then its socket closes
            last = None
            try:
                while True:
                    message = await busy.recv()
                    if isinstance(message, str):
                        last = json.loads(message)
            except websockets.ConnectionClosed as e:
                busy_close = e.rcvd.code
            rest_cut = await asyncio.to_thread(cut_off, rest.read_to_end)
            grpc_cut = await asyncio.to_thread(cut_off, call.read_to_end)
            rest.close()
            call.close()
            exit_code = await asyncio.to_thread(srv.wait, 60)
            return idle_close, last, busy_close, rest_cut, grpc_cut, exit_code, time.monotonic() - started

        idle_close, last, busy_close, rest_cut, grpc_cut, exit_code, took = asyncio.run(go())
        assert idle_close == 1001 and busy_close == 1001
        assert last["context_id"] == "c" and "drain_timeout_s has passed" in last.get("error", {}).get("message", ""), last
        assert rest_cut  # the REST body ends short: an incomplete response, not a short file
        assert grpc_cut  # UNAVAILABLE or CANCELLED
        assert exit_code == 0
        # drain_timeout_s (1 s) + unwinding (it used to take 43-47 s); a bound for a stuck drain, far
        # above what a loaded machine needs
        assert took < 30
        log = srv.log()
        assert "drain timeout: cancelling 3 stream(s)" in log and "stopped" in log
        assert "A long answer" not in log  # request text never reaches the log
    finally:
        if srv.running:
            stop_server(srv)
