"""WebSocket /v1/audio/stream with the `websockets` client."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import websockets

from tests.support.servers import MAX_TOKENS, same_speech
from tests.support.ws import until_done, ws_url


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
    heard = done.pop("heard")
    assert done == {"done": True, "cancelled": True, "context_id": "talk"}
    assert heard["sent_s"] > 0 and heard["pieces"] == []  # its one piece was still being spoken
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


async def error_reply(ws, context_id=None) -> dict:
    """The next error frame (for ``context_id``), passing over audio and other contexts' frames; a reply
    that never comes fails the test (after a minute) rather than hanging it."""
    while True:
        msg = await asyncio.wait_for(ws.recv(), 60)
        if isinstance(msg, bytes):
            continue
        data = json.loads(msg)
        if "error" in data and data.get("context_id") == context_id:
            return data["error"]
        assert "error" not in data, data


def test_messages_without_an_action_are_answered_and_change_nothing(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"context_id": "busy", "append": "Still speaking", "voice": "tara"}))
            errors = []
            for message in [{"event": "connected"}, {"input": "x", "event": "start"}, {}, {"voice": "tara"},
                            {"context_id": "busy"}, {"context_id": "busy", "flush": False, "end": False},
                            {"context_id": "busy", "text": "Hello.", "input": "Hello."}]:
                await ws.send(json.dumps(message))
                errors.append(await error_reply(ws, message.get("context_id")))
            await ws.send(json.dumps({"context_id": "busy", "end": True}))
            audio, done = await until_done(ws, "busy")
            return errors, audio, done

    errors, audio, done = asyncio.run(go())
    assert all(e["code"] == "invalid_request" for e in errors), errors
    assert "unknown option 'event'" in errors[0]["message"] and "unknown option 'event'" in errors[1]["message"]
    assert all("needs one of: text (or input), append, flush, end, cancel" in e["message"] for e in errors[2:6])
    assert "not both" in errors[6]["message"]
    # the context the refused messages named goes on: only its own text was spoken
    assert done["metrics"]["pieces"] == 1 and len(b"".join(audio)) == 4 * 2048 * 2


def test_input_is_openai_name_for_text(server):
    async def go(message):
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps(message))
            audio, done = await until_done(ws, message.get("context_id"))
            return len(b"".join(audio)), done

    text = "Hello there, how are you today?"
    by_text, by_input, by_input_ctx, short = (
        asyncio.run(go({"text": text, "voice": "tara"})), asyncio.run(go({"input": text, "voice": "tara"})),
        asyncio.run(go({"context_id": "c", "input": text, "voice": "tara"})), asyncio.run(go({"input": "Hi!"})))
    assert by_input[0] == by_text[0] == by_input_ctx[0] == 2 * 4 * 2048 * 2  # two pieces, pcm as binary frames
    assert by_input_ctx[1]["context_id"] == "c"
    for _, done in (by_input, by_input_ctx):  # the same text was spoken: the same prompts
        assert done["metrics"]["prompt_tokens"] == by_text[1]["metrics"]["prompt_tokens"]
    assert short[1]["metrics"]["prompt_tokens"] != by_text[1]["metrics"]["prompt_tokens"]


def test_non_string_text_is_refused_naming_the_field(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"context_id": "open", "append": "Hello", "voice": "tara"}))
            errors = []
            for field in ("text", "input", "append"):
                for value in (5, 1.5, True, ["Hi."], {"text": "Hi."}):
                    for cid in ("open", "new"):  # an open context, and one the message would open
                        await ws.send(json.dumps({"context_id": cid, field: value}))
                        errors.append((field, await error_reply(ws, cid)))
            await ws.send(json.dumps({"context_id": "new", "text": "Fine."}))
            await until_done(ws, "new")  # none of the refused messages opened "new"
            await ws.send(json.dumps({"context_id": "open", "append": " there.", "end": True}))
            return errors, await until_done(ws, "open")

    errors, (audio, done) = asyncio.run(go())
    assert len(errors) == 30
    for field, error in errors:
        assert error["code"] == "invalid_request" and error["message"].startswith(f"'{field}' must be a string"), error
    assert done["metrics"]["pieces"] == 1 and len(b"".join(audio)) == 4 * 2048 * 2  # "Hello there." and nothing else


def test_a_refused_first_message_opens_nothing(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send('{"context_id": "a", "append": "x\\ud800y", "voice": "leo"}')  # a lone surrogate
            refused = await error_reply(ws, "a")
            await ws.send(json.dumps({"context_id": "a", "flush": True}))
            unknown = await error_reply(ws, "a")
            await ws.send(json.dumps({"context_id": "a", "text": "Hello there.", "response_format": "mulaw"}))
            return refused, unknown, await until_done(ws, "a")

    refused, unknown, (audio, done) = asyncio.run(go())
    assert "lone surrogate" in refused["message"]
    assert unknown["message"].startswith("unknown context 'a'")
    assert abs(len(b"".join(audio)) - 4 * 2048 / 3) <= 2  # opened afresh, with this message's settings


def test_settings_on_an_open_context_are_refused_and_repeats_accepted(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"context_id": "a", "append": "Hello", "voice": "leah"}))
            errors = []
            for change in [{"response_format": "mulaw"}, {"format": "wav"}, {"sample_rate": 16000},
                           {"voice": "leo"}, {"temperature": 0.1}, {"seed": 7}, {"max_tokens": 100}]:
                await ws.send(json.dumps({"context_id": "a", "append": " REFUSED.", **change}))
                errors.append(await error_reply(ws, "a"))
            # the same values again (an alias of the voice, the defaults spelled out) are accepted
            await ws.send(json.dumps({"context_id": "a", "append": " there.", "voice": "SHIMMER", "format": "pcm",
                                      "sample_rate": 24000, "max_tokens": MAX_TOKENS, "end": True}))
            return errors, await until_done(ws, "a")

    errors, (audio, done) = asyncio.run(go())
    assert [e["code"] for e in errors] == ["invalid_request"] * 7
    assert errors[0]["message"] == ("context 'a' is already open with response_format 'pcm': settings are fixed by "
                                    "its first message; open another context_id")
    for error, shown in zip(errors[1:], ["format 'pcm'", "sample_rate 24000", "voice 'leah'", "temperature",
                                         "seed unset", f"max_tokens {MAX_TOKENS}"], strict=True):
        assert f"already open with {shown}" in error["message"], error
    assert done["metrics"]["pieces"] == 1 and len(b"".join(audio)) == 4 * 2048 * 2  # pcm, "Hello there." only


def test_default_context_settings_hold_until_done_then_the_next_text_sets_its_own(server):
    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            # opened by an append: open until "end"; a change of settings is refused
            await ws.send(json.dumps({"append": "Hello", "voice": "tara"}))
            await ws.send(json.dumps({"append": " REFUSED.", "response_format": "mulaw"}))
            refused_open = await error_reply(ws)
            await ws.send(json.dumps({"append": " there.", "end": True}))
            pcm, _ = await until_done(ws)
            # a whole text ends its context at once; until its done, another text is refused
            await ws.send(json.dumps({"text": "A long answer.", "max_tokens": 800, "min_tokens": 800}))
            while not isinstance(await ws.recv(), bytes):  # it is speaking
                pass
            await ws.send(json.dumps({"text": "Hello there.", "response_format": "mulaw"}))
            refused_ended = await error_reply(ws)
            await ws.send(json.dumps({"cancel": True}))
            while isinstance(msg := await ws.recv(), bytes) or not json.loads(msg).get("cancelled"):
                pass
            # after its done, the next text opens a new context with its own settings
            await ws.send(json.dumps({"text": "Hello there.", "response_format": "mulaw"}))
            mulaw, done = await until_done(ws)
            return refused_open, pcm, refused_ended, mulaw, done

    refused_open, pcm, refused_ended, mulaw, done = asyncio.run(go())
    assert refused_open["message"].startswith("the utterance without a context_id is already open with "
                                              "response_format 'pcm'")
    assert len(b"".join(pcm)) == 4 * 2048 * 2  # "Hello there." as pcm, without the refused text
    assert refused_ended["message"].startswith("this context has ended and is still sending its audio")
    assert done["done"] is True and abs(len(b"".join(mulaw)) - 4 * 2048 / 3) <= 2  # mu-law at 8 kHz


def test_ttfb_counts_from_the_message_that_completed_the_text_not_from_the_open(server):
    """The server's TTFB lies inside what the client saw, from sending the message that completed the
    first piece to its first audio; the context was opened long before (while another one spoke)."""

    async def go(opener, completer):
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"context_id": "late", **opener}))
            await ws.send(json.dumps({"context_id": "hold", "text": "Meanwhile.", "max_tokens": 200,
                                      "min_tokens": 200}))
            await until_done(ws, "hold")  # the socket waits on an event, not a timer
            sent = time.monotonic()
            await ws.send(json.dumps({"context_id": "late", **completer}))
            first = None
            while True:
                data = json.loads(await ws.recv())
                assert "error" not in data, data
                if data.get("type") == "audio" and first is None:
                    first = time.monotonic()
                if data.get("done"):
                    return 1000 * (first - sent), data["metrics"]["ttfb_ms"]

    cases = [({"append": ""}, {"append": "Hello there, ", "end": True}),
             ({"append": "Hello there"}, {"flush": True, "end": True}),
             ({"append": "Hello"}, {"text": " there."})]

    async def each():
        return await asyncio.gather(*(go(opener, completer) for opener, completer in cases))  # (one socket each)

    for (opener, completer), (seen_ms, ttfb_ms) in zip(cases, asyncio.run(each()), strict=True):
        assert 0 < ttfb_ms <= seen_ms, (opener, completer, ttfb_ms, seen_ms)
