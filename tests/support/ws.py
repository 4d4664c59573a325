"""The WebSocket as tests speak it."""

from __future__ import annotations

import base64
import json


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


def prompt_tokens(server, body: dict, headers: dict | None = None) -> int:
    """The prompt tokens the model was given for one WebSocket synthesis of ``body`` (voice tara, seed 1,
    28 tokens unless it says otherwise): what the model read, seen from outside."""
    import asyncio

    import websockets

    async def go() -> dict:
        async with websockets.connect(ws_url(server), additional_headers=headers or {}) as ws:
            await ws.send(json.dumps({"voice": "tara", "seed": 1, "max_tokens": 28, **body}))
            while isinstance(reply := await ws.recv(), bytes):
                pass
            return json.loads(reply)

    done = asyncio.run(go())
    assert done.get("done"), done
    return done["metrics"]["prompt_tokens"]
