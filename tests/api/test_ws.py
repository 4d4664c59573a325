"""WebSocket /v1/audio/stream with the `websockets` client."""

from __future__ import annotations

import asyncio
import base64
import json

import websockets

from .conftest import MAX_TOKENS, same_speech


def ws_url(server) -> str:
    return server.http.replace("http://", "ws://") + "/v1/audio/stream"


async def until_done(ws, context_id=None, others: list | None = None) -> tuple[list, dict]:
    """Audio (bytes, or decoded JSON audio for the context) until its done message; audio of other
    contexts goes to ``others`` when given."""
    audio, done = [], None
    while done is None:
        msg = await ws.recv()
        if isinstance(msg, bytes):
            audio.append(msg)
            continue
        data = json.loads(msg)
        assert "error" not in data, data
        if data.get("context_id") != context_id:
            if others is not None and data.get("type") == "audio":
                others.append(base64.b64decode(data["audio"]))
            continue
        if data.get("type") == "audio":
            audio.append(base64.b64decode(data["audio"]))
        elif data.get("done"):
            done = data
    return audio, done


def test_seed_004_exchange(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"text": "Hello!", "voice": "tara"}))
            return await until_done(ws)

    audio, done = asyncio.run(go())
    assert len(b"".join(audio)) == 4 * 2048 * 2  # pcm s16le 24 kHz by default
    assert done["done"] is True and done["metrics"]["ttfb_ms"] > 0 and done["metrics"]["tokens"] == MAX_TOKENS


def test_two_contexts_on_one_socket(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"context_id": "a", "text": "First caller.", "voice": "tara"}))
            await ws.send(json.dumps({"context_id": "b", "text": "Second caller.", "voice": "leo",
                                      "response_format": "mulaw"}))
            audio: dict[str, list[bytes]] = {"a": [], "b": []}
            done = {}
            while len(done) < 2:
                data = json.loads(await ws.recv())
                assert "error" not in data, data
                if data.get("type") == "audio":
                    audio[data["context_id"]].append(base64.b64decode(data["audio"]))
                elif data.get("done"):
                    done[data["context_id"]] = data
            return audio, done

    audio, done = asyncio.run(go())
    assert len(b"".join(audio["a"])) == 4 * 2048 * 2
    assert abs(len(b"".join(audio["b"])) - 4 * 2048 / 3) <= 2  # mu-law at 8 kHz: one byte per sample
    assert set(done) == {"a", "b"}


def test_incremental_text_starts_speaking_on_the_first_clause(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"context_id": "llm", "append": "Sure, ", "voice": "tara"}))
            first = json.loads(await ws.recv())  # audio comes before the rest of the text is written
            await ws.send(json.dumps({"context_id": "llm", "append": "I can help with that"}))
            await ws.send(json.dumps({"context_id": "llm", "append": ". Anything else?"}))
            await ws.send(json.dumps({"context_id": "llm", "end": True}))
            rest, done = await until_done(ws, "llm")
            return first, rest, done

    first, rest, done = asyncio.run(go())
    assert first["type"] == "audio" and first["context_id"] == "llm"
    total = len(base64.b64decode(first["audio"])) + len(b"".join(rest))
    assert total == 3 * 4 * 2048 * 2  # three pieces: "Sure,", "I can help with that.", "Anything else?"
    assert done["metrics"]["tokens"] == 3 * MAX_TOKENS


def test_cancel_barge_in_stops_generation_and_frees_the_slot(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"context_id": "talk", "text": "A very long answer.", "max_tokens": 800}))
            while json.loads(await ws.recv()).get("type") != "audio":
                pass
            await ws.send(json.dumps({"context_id": "talk", "cancel": True}))
            while True:
                data = json.loads(await ws.recv())
                if data.get("done"):
                    return data

    done = asyncio.run(go())
    assert done == {"done": True, "cancelled": True, "context_id": "talk"}
    assert server.eventually_idle()["kv_cache"]["free_slots"] == 8


def test_bad_messages_get_errors_and_the_socket_stays_usable(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            replies = []
            for raw in ["{oops", json.dumps([1]), json.dumps({"context_id": 5, "text": "x"}),
                        json.dumps({"context_id": "v", "text": "hi", "voice": "bob"}),
                        json.dumps({"context_id": "f", "text": "hi", "response_format": "wma"}),
                        json.dumps({"context_id": "t", "text": "hi", "temperature": 99}),
                        json.dumps({"context_id": "e", "text": ""})]:
                await ws.send(raw)
                replies.append(json.loads(await ws.recv()))
            await ws.send(json.dumps({"text": "Still here?"}))
            audio, done = await until_done(ws)
            return replies, audio, done

    replies, audio, done = asyncio.run(go())
    codes = [r["error"]["code"] for r in replies]
    assert codes == ["invalid_request", "invalid_request", "invalid_request", "unknown_voice", "unsupported_format",
                     "out_of_range", "invalid_request"]
    assert replies[3]["context_id"] == "v"
    assert done["done"] and len(b"".join(audio)) == 4 * 2048 * 2


def test_closing_the_socket_mid_stream_frees_the_slots(server):
    async def go():
        ws = await websockets.connect(ws_url(server))
        await ws.send(json.dumps({"context_id": "x", "text": "long", "max_tokens": 800}))
        await ws.send(json.dumps({"context_id": "y", "append": "another long one, ", "max_tokens": 800}))
        while json.loads(await ws.recv()).get("type") != "audio":
            pass
        await ws.close()

    asyncio.run(go())
    assert server.eventually_idle()["kv_cache"]["free_slots"] == 8


def test_voice_aliases_work_over_the_websocket(server):
    async def go(voice):
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"text": "Hello!", "voice": voice, "seed": 3}))
            return await until_done(ws)

    (alias, done), (voice, _) = asyncio.run(go("SHIMMER")), asyncio.run(go("leah"))
    assert done["done"] is True and same_speech(b"".join(alias), b"".join(voice))
