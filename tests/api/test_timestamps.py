"""Timestamps and the "heard" report on every streaming protocol, with real clients: the WebSocket
(``websockets``), gRPC (generated stubs) and SSE (the ``openai`` SDK's raw stream)."""

from __future__ import annotations

import asyncio
import base64
import json

import grpc
import pytest
import websockets
from openai import OpenAI

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import SECONDS
from tests.support.ws import ws_url

TEXT = "Sure, I can help with that. Then he left!   Anything else?"
PIECES = ["Sure,", "I can help with that. Then he left!", "Anything else?"]  # the first clause, then sentences
WHOLE = ["Sure, I can help with that. Then he left! Anything else?"]  # one synthesis: one segment
PIECE_SAMPLES = 4 * 2048  # the test server speaks 28 tokens = 4 frames per piece


def _check_pieces(pieces: list[dict], text: str, expected: list[str] = PIECES, rate: int = 24000) -> None:
    assert [p["text"] for p in pieces] == expected
    assert [p["index"] for p in pieces] == list(range(len(pieces)))
    for p in pieces:  # the caller's own characters, whitespace as sent
        assert text[p["start_char"]:p["end_char"]].split() == p["text"].split()
    assert pieces[-1]["end_char"] == len(text)
    for i, p in enumerate(pieces):  # exact: each piece's audio begins where its segment's does
        assert p["start_sample"] == i * PIECE_SAMPLES * rate // 24000
        assert p["end_sample"] == (i + 1) * PIECE_SAMPLES * rate // 24000
        assert abs(p["end_s"] - p["start_s"] - SECONDS) < 1e-6


def test_websocket_sends_a_timestamps_message_after_each_pieces_audio(server):
    async def speak():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"context_id": "c", "append": TEXT[:20], "voice": "tara", "timestamps": "chars"}))
            await ws.send(json.dumps({"context_id": "c", "append": TEXT[20:]}))
            await ws.send(json.dumps({"context_id": "c", "end": True}))
            sent, order = 0, []
            while True:
                data = json.loads(await ws.recv())
                assert "error" not in data, data
                if data.get("type") == "audio":
                    sent += len(base64.b64decode(data["audio"])) // 2
                    order.append("audio")
                elif data.get("type") == "timestamps":
                    assert data["end_sample"] == sent  # right after its last audio
                    order.append(data)
                elif data.get("done"):
                    return [m for m in order if m != "audio"]

    pieces = asyncio.run(speak())
    _check_pieces(pieces, TEXT)
    words = pieces[1]["word_timestamps"]
    assert words["words"] == "I can help with that. Then he left!".split() and words["estimated"] is True
    assert pieces[1]["start_s"] - 1e-3 <= words["start"][0] < words["end"][-1] <= pieces[1]["end_s"] + 1e-3
    assert "".join(pieces[1]["alignment"]["chars"]) == PIECES[1]


def test_websocket_cancel_reports_what_was_heard(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"context_id": "c", "append": TEXT[:20], "voice": "tara", "timestamps": "pieces"}))
            await ws.send(json.dumps({"context_id": "c", "append": TEXT[20:], "end": True}))
            while True:  # the first piece's audio has all been sent
                data = json.loads(await ws.recv())
                if data.get("type") == "timestamps":
                    break
            await ws.send(json.dumps({"context_id": "c", "cancel": True, "played_s": 0.4}))
            while True:  # (its own done may come first: it may have ended before the cancel came)
                data = json.loads(await ws.recv())
                if data.get("cancelled"):
                    barge = data
                    break
            # after the whole utterance was sent, the report still comes (a listener plays long after)
            await ws.send(json.dumps({"context_id": "d", "text": TEXT, "voice": "tara", "timestamps": "pieces"}))
            stamps = []
            while not (data := json.loads(await ws.recv())).get("done"):
                if data.get("type") == "timestamps":
                    stamps.append(data)
            await ws.send(json.dumps({"context_id": "d", "cancel": True, "played_s": SECONDS + 0.01}))
            return barge, stamps, json.loads(await ws.recv())

    barge, stamps, late = asyncio.run(go())
    heard = barge["heard"]
    assert barge["cancelled"] is True and heard["sent_s"] >= SECONDS - 1e-6 and heard["played_s"] == 0.4
    assert heard["heard_s"] == min(heard["sent_s"], 0.4)  # (the second piece may not have been sent yet)
    assert [p["text"] for p in heard["pieces"]] == ["Sure,"]  # the only piece wholly inside (0.341 s)
    assert TEXT[:heard["end_char"]].startswith("Sure,") and heard["words"]["estimated"] is True
    assert all(end <= heard["heard_s"] for end in heard["words"]["end"])
    assert TEXT[:heard["end_char"]].split()[1:] == heard["words"]["words"]  # the estimated words after it
    late_heard = late["heard"]
    assert late["context_id"] == "d" and late_heard["sent_s"] == pytest.approx(stamps[-1]["end_s"], abs=1e-6)
    assert [p["text"] for p in late_heard["pieces"]] == [stamps[0]["text"]]
    assert late_heard["end_char"] >= stamps[0]["end_char"]


def test_websocket_refuses_played_s_without_cancel(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"text": "Hi.", "played_s": 1.0}))
            return json.loads(await ws.recv())

    assert "played_s" in asyncio.run(go())["error"]["message"]


def test_grpc_streams_carry_pieces_on_the_chunk_that_ends_them(server):
    async def go():
        async with grpc.aio.insecure_channel(server.grpc) as channel:
            stub = tts_pb2_grpc.TextToSpeechStub(channel)
            req = tts_pb2.SynthesizeRequest(text=TEXT, voice="tara", timestamps="words",
                                            audio=tts_pb2.AudioConfig(sample_rate_hz=16000))
            whole = [c async for c in stub.SynthesizeStream(req)]

            async def requests():
                yield tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.StreamingConfig(voice="zoe", timestamps="pieces"))
                yield tts_pb2.StreamingSynthesizeRequest(text=TEXT[:20])
                yield tts_pb2.StreamingSynthesizeRequest(text=TEXT[20:])

            incremental = [c async for c in stub.StreamingSynthesize(requests())]
            bad = stub.SynthesizeStream(tts_pb2.SynthesizeRequest(text="Hi", timestamps="letters"))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                [c async for c in bad]
            return whole, incremental, refused.value.code()

    whole, incremental, refused = asyncio.run(go())
    assert refused == grpc.StatusCode.INVALID_ARGUMENT
    for chunks, rate, words, expected in ((whole, 16000, True, WHOLE), (incremental, 24000, False, PIECES)):
        pieces = []
        for c in chunks:
            for p in c.pieces:
                # its audio has been sent (but for what a resampler holds back: ~35 ms at 16 kHz)
                assert p.end_sample <= c.offset_samples + len(c.audio) // 2 + 0.05 * rate
                pieces.append({"index": p.index, "text": p.text, "start_char": p.start_char, "end_char": p.end_char,
                               "start_sample": p.start_sample, "end_sample": p.end_sample, "start_s": p.start_s,
                               "end_s": p.end_s})
                assert bool(p.words) == words
        _check_pieces(pieces, TEXT, expected, rate)


def test_sse_sends_timestamps_events_at_the_responses_speed(server):
    client = OpenAI(base_url=server.http + "/v1", api_key="unused")
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=TEXT, response_format="pcm", stream_format="sse", speed=2.0,
            extra_body={"timestamps": "words"}) as response:
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    stamps = [e for e in events if e["type"] == "speech.audio.timestamps"]
    assert [s["text"] for s in stamps] == WHOLE
    assert abs(stamps[-1]["end_s"] - SECONDS / 2) < 1e-3  # at speed 2: half the time
    assert events[-1]["type"] == "speech.audio.done"
    with pytest.raises(Exception, match="stream_format"):
        client.audio.speech.create(model="tts-1", voice="alloy", input="Hi", extra_body={"timestamps": "pieces"})
