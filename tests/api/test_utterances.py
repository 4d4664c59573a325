"""Incremental text over WebSocket and gRPC: one Utterance behind both, and what a hostile or
careless client can send to a socket without hurting anyone else."""

from __future__ import annotations

import asyncio
import base64
import json

import aiohttp
import grpc
import numpy as np
import pytest
import websockets

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import MAX_TOKENS
from tests.support.ws import until_done, ws_url

# appends (str) and flushes (None), as an LLM and its caller would send them
SEQUENCE = ["Sure, ", "I can help with that", ". Dr. Smith will call", " you at 5 p.m. today. And", None,
            " then goodbye."]
PIECES = ["Sure,", "I can help with that.", "Dr. Smith will call you at 5 p.m. today.", "And", "then goodbye."]
SEED = 11


async def _ws_utterance(server) -> tuple[bytes, dict]:
    async with websockets.connect(ws_url(server)) as ws:
        for i, text in enumerate(SEQUENCE):
            first = {"voice": "tara", "seed": SEED} if i == 0 else {}
            await ws.send(json.dumps({"context_id": "u", **({"flush": True} if text is None else {"append": text}),
                                      **first}))
        await ws.send(json.dumps({"context_id": "u", "end": True}))
        audio, done = await until_done(ws, "u")
        return b"".join(audio), done["metrics"]


async def _grpc_utterance(server) -> tuple[bytes, dict]:
    async def requests():
        yield tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.StreamingConfig(
            voice="tara", sampling=tts_pb2.SamplingOptions(seed=SEED)))
        for text in SEQUENCE:
            yield tts_pb2.StreamingSynthesizeRequest(flush=True) if text is None else \
                tts_pb2.StreamingSynthesizeRequest(text=text)

    async with grpc.aio.insecure_channel(server.grpc) as channel:
        chunks = [c async for c in tts_pb2_grpc.TextToSpeechStub(channel).StreamingSynthesize(requests())]
    m = chunks[-1].metrics
    return b"".join(c.audio for c in chunks), {"pieces": m.pieces, "tokens": m.tokens}


async def _rest_pcm(server, text: str) -> bytes:
    async with aiohttp.ClientSession() as s, s.post(server.http + "/v1/audio/speech", json={
            "input": text, "voice": "tara", "response_format": "pcm", "seed": SEED}) as r:
        assert r.status == 200
        return await r.read()


@pytest.mark.parametrize("protocol", ["websocket", "grpc"])
def test_websocket_and_grpc_speak_the_same_pieces_in_order(server, protocol):
    async def go():
        audio, metrics = await (_ws_utterance(server) if protocol == "websocket" else _grpc_utterance(server))
        expected = [await _rest_pcm(server, piece) for piece in PIECES]  # each piece alone, same seed
        return audio, metrics, expected

    audio, metrics, expected = asyncio.run(go())
    assert metrics["pieces"] == len(PIECES) and metrics["tokens"] == len(PIECES) * MAX_TOKENS
    assert len(audio) == len(PIECES) * 4 * 2048 * 2
    # The same pieces in the same order: each piece's audio is (up to the codec's float rounding and
    # a provisional first chunk that depends on timing) the audio of that piece alone.
    got = np.frombuffer(audio, np.int16).reshape(len(PIECES), -1).astype(np.float64)
    ref = np.stack([np.frombuffer(e, np.int16) for e in expected]).astype(np.float64)
    distance = np.abs(got[:, None, 4096:] - ref[None, :, 4096:]).mean(axis=2)  # (got piece, expected piece)
    assert distance.argmin(axis=1).tolist() == list(range(len(PIECES)))
    assert distance.diagonal().max() < 0.5 * distance.mean()


def test_misbehaving_websocket_messages_get_errors_and_nothing_else_breaks(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            early_ok_audio = []

            async def send(message) -> dict:
                await ws.send(message if isinstance(message, str) else json.dumps(message))
                while True:  # keep the audio of the context that is speaking
                    reply = json.loads(await ws.recv())
                    if reply.get("type") != "audio":
                        return reply
                    early_ok_audio.append(base64.b64decode(reply["audio"]))

            await ws.send(json.dumps({"context_id": "ok", "text": "Keep talking.", "max_tokens": 140,
                                      "min_tokens": 140}))
            replies = [await send(m) for m in [
                {},
                {"context_id": "ok", "append": "more after the end"},
                {"context_id": "ghost", "flush": True},
                {"context_id": "n", "text": 5},
                {"context_id": "n", "append": ["list"]},
                '{"context_id": "big", "text": "hi", "max_tokens": 1' + "0" * 400 + "}",
                {"context_id": "n", "text": "hi", "top_k": 1.5},
                {"context_id": "n", "text": "hi", "colour": "blue"},
                {"context_id": "n", "text": "hi", "voice": "v" * 10_000},
                '[' * 30_000 + ']' * 30_000,
            ]]
            # an emoji split across two appends (UTF-16 halves) is joined, not a closed socket
            await ws.send(json.dumps({"context_id": "emoji", "append": "smile \ud83d", "seed": 1}))
            await ws.send(json.dumps({"context_id": "emoji", "append": "\ude00 please."}))
            await ws.send(json.dumps({"context_id": "emoji", "end": True}))
            emoji_audio, emoji_done = await until_done(ws, "emoji", others=early_ok_audio)
            ok_audio, ok_done = await until_done(ws, "ok")
            ok_audio = early_ok_audio + ok_audio
            return replies, emoji_audio, emoji_done, ok_audio, ok_done

    replies, emoji_audio, emoji_done, ok_audio, ok_done = asyncio.run(go())
    messages = [r["error"]["message"] for r in replies]
    assert "a message needs one of" in messages[0]
    assert "has ended and is still sending its audio" in messages[1] and replies[1]["context_id"] == "ok"
    assert "unknown context 'ghost'" in messages[2]
    assert messages[3] == "'text' must be a string, got 5" and "'append' must be a string" in messages[4]
    assert "'max_tokens' = 1000" in messages[5] and "out of range" in messages[5]
    assert "'top_k' must be an integer" in messages[6] and "unknown option 'colour'" in messages[7]
    assert "longer than 128 characters" in messages[8] and "nested too deeply" in messages[9]
    assert all(len(m) < 400 for m in messages)
    assert len(b"".join(emoji_audio)) == 4 * 2048 * 2 and emoji_done["metrics"]["pieces"] == 1
    assert len(b"".join(ok_audio)) == 20 * 2048 * 2  # the context that was speaking lost nothing
    assert server.eventually_idle()["kv_cache"]["free_slots"] == 8


def test_a_message_over_the_size_limit_closes_the_socket_with_1009(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"text": "x" * 70_000}))
            with pytest.raises(websockets.ConnectionClosed) as info:
                await ws.recv()
            return info.value.rcvd

    close = asyncio.run(go())
    assert close.code == 1009  # "message too big", the standard close code


def test_one_socket_cannot_take_every_admission_place(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            for i in range(8):  # contexts waiting for the end of their first sentence hold no place
                await ws.send(json.dumps({"context_id": f"c{i}", "append": "no sentence end yet"}))
            await ws.send(json.dumps({"context_id": "c8", "append": "one too many"}))
            refused = json.loads(await ws.recv())
            for i in range(8):
                await ws.send(json.dumps({"context_id": f"c{i}", "cancel": True}))
            return refused

    refused = asyncio.run(go())
    assert refused["context_id"] == "c8" and "server.max_contexts_per_socket is 8" in refused["error"]["message"]


def test_grpc_bad_utf8_and_bad_streams_are_invalid_argument(server):
    async def go():
        async with grpc.aio.insecure_channel(server.grpc) as channel:
            raw = channel.unary_unary("/lyre.v1.TextToSpeech/Synthesize")  # bytes in, bytes out
            with pytest.raises(grpc.aio.AioRpcError) as bad_utf8:
                await raw(b"\x0a\x02\xff\xfe")  # field 1 (text): two bytes that are not UTF-8
            stub = tts_pb2_grpc.TextToSpeechStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as long_voice:
                await stub.Synthesize(tts_pb2.SynthesizeRequest(text="hi", voice="v" * 100_000))
            with pytest.raises(grpc.aio.AioRpcError) as nan:
                await stub.Synthesize(tts_pb2.SynthesizeRequest(
                    text="hi", sampling=tts_pb2.SamplingOptions(temperature=float("nan"))))

            async def two_configs():
                yield tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.StreamingConfig())
                yield tts_pb2.StreamingSynthesizeRequest(text="Hello there. ")
                yield tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.StreamingConfig())

            with pytest.raises(grpc.aio.AioRpcError) as twice:
                _ = [c async for c in stub.StreamingSynthesize(two_configs())]
            return bad_utf8.value, long_voice.value, nan.value, twice.value

    errors = asyncio.run(go())
    assert [e.code() for e in errors] == [grpc.StatusCode.INVALID_ARGUMENT] * 4
    assert "not a valid SynthesizeRequest message" in errors[0].details()
    assert "longer than 128 characters" in errors[1].details() and len(errors[1].details()) < 400
    assert "'temperature' must be a finite number" in errors[2].details()
    assert "only the first message may be a config" in errors[3].details()
    assert server.eventually_idle()["kv_cache"]["free_slots"] == 8


def test_clients_that_hang_up_mid_stream_leave_no_errors_and_no_slots(server):
    async def hang_up(body: dict) -> None:
        async with aiohttp.ClientSession() as s:
            r = await s.post(server.http + "/v1/audio/speech", json={"input": "Goodbye now.", **LONG_BODY, **body})
            await r.content.readany()
            r.close()  # drop the connection mid-stream

    async def go():
        for body in ({"response_format": "pcm"}, {"response_format": "mp3"}, {"stream_format": "sse"}):
            await hang_up(body)
        async with websockets.connect(ws_url(server)) as ws:  # and a socket closed mid-context
            await ws.send(json.dumps({"context_id": "x", "text": "Goodbye now.", **LONG_BODY}))
            await ws.recv()

    mark = server.log_mark()
    asyncio.run(go())
    assert server.eventually_idle()["kv_cache"]["free_slots"] == 8
    log = server.log(since=mark)
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    assert "Goodbye now" not in log  # request text is never logged


LONG_BODY = {"max_tokens": 700, "min_tokens": 700}
