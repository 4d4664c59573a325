"""REST: the OpenAI SDK and plain HTTP against the real server."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import io
import json
import struct

import aiohttp
import av
import openai
import pytest
import requests
import soundfile as sf
from openai import OpenAI

from tests.support.servers import MAX_TOKENS, SECONDS, same_speech
from tests.support.waiting import until


def decoded_seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as c:
        s = c.streams.audio[0]
        return sum(f.samples for f in c.decode(s)) / s.rate


@pytest.fixture(scope="module")
def openai_client(server):
    return OpenAI(base_url=server.http + "/v1", api_key="unused")


def test_openai_sdk_wav_and_pcm(openai_client):
    wav = openai_client.audio.speech.create(model="orpheus", voice="tara", input="Hello world", response_format="wav",
                                            extra_body={"seed": 1})
    audio, rate = sf.read(io.BytesIO(wav.content), dtype="int16")
    assert rate == 24000 and len(audio) == 4 * 2048
    pcm = openai_client.audio.speech.create(model="orpheus", voice="leo", input="Hello world", response_format="pcm")
    assert len(pcm.content) == 4 * 2048 * 2


def test_openai_sdk_streaming_response(openai_client):
    with openai_client.audio.speech.with_streaming_response.create(
            model="orpheus", voice="tara", input="Streaming now", response_format="wav") as response:
        parts = list(response.iter_bytes())
    data = b"".join(parts)
    riff_size, = struct.unpack("<I", data[4:8])
    data_size, = struct.unpack("<I", data[40:44])
    assert riff_size == data_size == 0xFFFFFFFF  # streaming WAV: length unknown up front
    assert (len(data) - 44) // 2 == 4 * 2048


def test_async_openai_sdk_streams_audio_and_sse_events(server):
    """AsyncOpenAI: a streamed pcm body, and stream_format="sse" read as the SDK's event stream."""
    from openai import AsyncOpenAI

    async def go():
        client = AsyncOpenAI(base_url=server.http + "/v1", api_key="unused")
        async with client.audio.speech.with_streaming_response.create(
                model="gpt-4o-mini-tts", voice="coral", input="Async now", response_format="pcm") as r:
            pcm = b"".join([part async for part in r.iter_bytes()])
        async with client.audio.speech.with_streaming_response.create(
                model="gpt-4o-mini-tts", voice="coral", input="Async now", response_format="pcm",
                stream_format="sse") as r:
            lines = [line async for line in r.iter_lines()]
        await client.close()
        return pcm, [json.loads(line[6:]) for line in lines if line.startswith("data: ")]

    pcm, events = asyncio.run(go())
    assert len(pcm) == 4 * 2048 * 2
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert len(audio) == len(pcm) and events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] == MAX_TOKENS


def test_openai_length_input_is_split_and_spoken_as_one_stream(openai_client):
    """Past the profile's 250 characters, up to OpenAI's 4096: sentences spoken in order, one response."""
    text = " ".join(f"Here is sentence {i}, one of many in a long answer." for i in range(80))
    assert 250 < len(text) <= 4096
    pcm = openai_client.audio.speech.create(model="tts-1", voice="alloy", input=text, response_format="pcm").content
    pieces = len(pcm) / 2 / (4 * 2048)  # each piece (a few sentences) is one synthesis of 4 frames here
    assert pieces == int(pieces) and pieces >= len(text) / 250


@pytest.mark.parametrize("speed", [0.5, 2.0, 4.0])
def test_openai_speed_stretches_time(openai_client, speed):
    pcm = openai_client.audio.speech.create(model="tts-1", voice="alloy", input="At speed.", response_format="pcm",
                                            speed=speed).content
    assert len(pcm) // 2 == round(4 * 2048 / speed)  # time-stretched (FFmpeg atempo), pitch kept


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_compressed_formats_decode_to_the_right_duration(openai_client, fmt):
    data = openai_client.audio.speech.create(model="orpheus", voice="tara", input="Compressed", response_format=fmt).content
    assert abs(decoded_seconds(data) - SECONDS) < 0.08


def bitrate_of(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as f:
        return f.streams.audio[0].codec_context.bit_rate


@pytest.mark.parametrize("fmt, asked, rate, got", [("mp3", None, None, 64000), ("mp3", 128000, None, 128000),
                                                  ("mp3", 32000, 8000, 32000), ("aac", None, None, 64000)])
def test_compressed_audio_has_a_voices_bitrate_by_default_and_the_one_asked_for(openai_client, fmt, asked, rate, got):
    # seeded: an encoder's average rate over a clip this short follows its content (AAC of unseeded
    # demo audio measured 62.2k-66.5k against 64k, and once past the 5% a fresh-clone run allows)
    extra = {"seed": 1, **{k: v for k, v in (("bitrate", asked), ("sample_rate", rate)) if v is not None}}
    data = openai_client.audio.speech.create(model="tts-1", voice="tara", input="Rich enough.", response_format=fmt,
                                             extra_body=extra).content
    assert abs(bitrate_of(data) - got) <= 0.05 * got and abs(decoded_seconds(data) - SECONDS) < 0.08


@pytest.mark.parametrize("body, words", [({"response_format": "wav", "bitrate": 64000}, "applies to mp3"),
                                         ({"response_format": "mp3", "sample_rate": 8000, "bitrate": 128000}, "8000 to 64000"),
                                         ({"response_format": "opus", "bitrate": 1000}, "6000 to 256000")])
def test_a_bitrate_a_format_cannot_take_is_refused(server, body, words):
    r = requests.post(server.http + "/v1/audio/speech", json={"input": "Hi.", **body}, timeout=30)
    assert r.status_code == 422 and words in r.json()["error"]["message"]


@pytest.mark.parametrize("rate", [None, 16000])
def test_flac_from_the_openai_sdk_is_a_file_libsndfile_reads_whole(openai_client, rate):
    """FLAC is sent whole, its header holding the length and MD5: soundfile.read (libsndfile) reads
    it, sample for sample the PCM of the same tokens."""
    extra = {"seed": 5, **({"sample_rate": rate} if rate else {})}
    flac = openai_client.audio.speech.create(model="tts-1", voice="nova", input="Lossless", response_format="flac",
                                             extra_body=extra)
    pcm = openai_client.audio.speech.create(model="tts-1", voice="nova", input="Lossless", response_format="pcm",
                                            extra_body=extra).content
    audio, got_rate = sf.read(io.BytesIO(flac.content), dtype="int16")
    assert got_rate == (rate or 24000) and flac.response.headers["Content-Length"] == str(len(flac.content))
    assert same_speech(audio.tobytes(), pcm)


@pytest.mark.parametrize("fmt, rate, per_sample", [("mulaw", None, 1), ("alaw", None, 1), ("pcm", 16000, 2),
                                                   ("mulaw", 16000, 1)])
def test_telephony_formats_and_resampling(server, fmt, rate, per_sample):
    async def go():
        body = {"input": "Telephony", "voice": "tara", "response_format": fmt, **({"sample_rate": rate} if rate else {})}
        async with aiohttp.ClientSession() as s, s.post(server.http + "/v1/audio/speech", json=body) as r:
            return r.status, r.headers, await r.read()

    status, headers, data = asyncio.run(go())
    out_rate = rate or 8000
    assert status == 200 and headers["X-Sample-Rate"] == str(out_rate)
    assert abs(len(data) / per_sample - SECONDS * out_rate) <= 2


def test_wav_at_another_sample_rate(server):
    async def go():
        body = {"text": "Seed style request", "voice": "tara", "sample_rate": 8000}
        async with aiohttp.ClientSession() as s, s.post(server.http + "/v1/audio/speech", json=body) as r:
            return r.headers["Content-Type"], await r.read()

    ctype, data = asyncio.run(go())
    audio, rate = sf.read(io.BytesIO(data), dtype="int16")
    assert ctype == "audio/wav" and rate == 8000 and abs(len(audio) - SECONDS * 8000) <= 2


def test_sse_stream_format(server):
    async def go():
        body = {"input": "Events please", "voice": "tara", "response_format": "pcm", "stream_format": "sse"}
        async with aiohttp.ClientSession() as s, s.post(server.http + "/v1/audio/speech", json=body) as r:
            return r.headers["Content-Type"], await r.text()

    ctype, text = asyncio.run(go())
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert ctype.startswith("text/event-stream")
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] == MAX_TOKENS and events[-1]["usage"]["input_tokens"] > 0
    assert sum(len(base64.b64decode(d["audio"])) for d in deltas) == 4 * 2048 * 2


BAD_REQUESTS = [
    (b"{not json", 400, "invalid_request"),
    (b"[1, 2]", 400, "invalid_request"),
    ({"voice": "tara"}, 400, "invalid_request"),
    ({"input": "", "voice": "tara"}, 400, "invalid_request"),
    ({"input": 42, "voice": "tara"}, 400, "invalid_request"),
    ({"input": "x" * 4097, "voice": "tara"}, 422, "text_too_long"),  # OpenAI's 4096 is the most
    ({"input": "hi", "voice": "bob"}, 404, "unknown_voice"),
    ({"input": "hi", "voice": 7}, 400, "invalid_request"),
    ({"input": "hi", "response_format": "ogg-vorbis"}, 422, "unsupported_format"),
    ({"input": "hi", "response_format": "wav", "sample_rate": 96000}, 422, "unsupported_format"),
    ({"input": "hi", "response_format": "opus", "sample_rate": 22050}, 422, "unsupported_format"),
    ({"input": "hi", "speed": 4.5}, 422, "out_of_range"),
    ({"input": "hi", "speed": 0.2}, 422, "out_of_range"),
    ({"input": "hi", "speed": "fast"}, 400, "invalid_request"),
    ({"input": "hi", "temperature": -0.5}, 422, "out_of_range"),
    ({"input": "hi", "top_p": 2}, 422, "out_of_range"),
    ({"input": "hi", "max_tokens": 2.5}, 400, "invalid_request"),
    ({"input": "hi", "seed": "abc"}, 400, "invalid_request"),
    ({"input": "hi", "stream_format": "chunks"}, 422, "out_of_range"),
    ({"input": "hi <|eot_id|> there"}, 400, "control_token"),
    ({"input": "hi", "language": "german"}, 400, "invalid_request"),  # Orpheus speaks English
    ({"input": "hi", "language": 3}, 400, "invalid_request"),
    ({"input": "x" * 300_000}, 413, "request_too_large"),
    # hostile values: none may reach the engine (a 500 before)
    (b'{"input": "hi", "max_tokens": 1' + b"0" * 400 + b"}", 422, "out_of_range"),
    (b'{"input": "hi", "seed": 1' + b"0" * 400 + b"}", 422, "out_of_range"),
    (b'{"input": "hi", "top_k": 1' + b"0" * 400 + b"}", 422, "out_of_range"),
    (b'{"input": "hi", "temperature": NaN}', 400, "invalid_request"),
    (b'{"input": "hi", "top_p": Infinity}', 400, "invalid_request"),
    ({"input": "hi", "top_k": 1.5}, 400, "invalid_request"),
    ({"input": "hi", "seed": True}, 400, "invalid_request"),
    ({"input": "hi", "temprature": 0.5}, 400, "invalid_request"),
    (b'{"input": "hi \\ud800"}', 400, "invalid_request"),
    (b"[" * 60_000 + b"]" * 60_000, 400, "invalid_request"),
    ({"input": "hi", "voice": "v" * 100_000}, 400, "invalid_request"),
]


@pytest.mark.parametrize("body, status, code", BAD_REQUESTS, ids=[f"{i}-{c}" for i, (_, _, c) in enumerate(BAD_REQUESTS)])
def test_bad_input_gets_a_clear_json_error(server, body, status, code):
    async def go():
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with aiohttp.ClientSession() as s, s.post(server.http + "/v1/audio/speech", data=data,
                                                          headers={"Content-Type": "application/json"}) as r:
            return r.status, await r.json()

    got_status, payload = asyncio.run(go())
    assert got_status == status, payload
    assert payload["error"]["code"] == code and payload["error"]["message"] and payload["error"]["type"]
    assert len(payload["error"]["message"]) < 400  # client input is never echoed at length


def test_unknown_route_and_method_are_json_errors(server):
    status, body = server.get("/v1/nothing-here")
    assert status == 404 and body["error"]["code"] == "not_found" and body["error"]["type"] == "not_found_error"

    async def wrong_method():
        async with aiohttp.ClientSession() as s, s.get(server.http + "/v1/audio/speech") as r:
            return r.status, r.headers.get("Allow"), await r.json()

    status, allow, body = asyncio.run(wrong_method())
    assert status == 405 and allow == "POST" and body["error"]["code"] == "method_not_allowed"


def test_input_and_text_together_are_refused(server):
    async def go():
        async with aiohttp.ClientSession() as s, s.post(server.http + "/v1/audio/speech",
                                                          json={"input": "one", "text": "two"}) as r:
            return r.status, await r.json()

    status, body = asyncio.run(go())
    assert status == 400 and "not both" in body["error"]["message"]


def sessions_ended(server, outcome: str) -> float:
    text = server.get("/metrics")[1]
    line = next((x for x in text.splitlines() if x.startswith(f'lyre_sessions_total{{outcome="{outcome}"}}')), None)
    return float(line.split()[-1]) if line else 0.0


def test_a_client_that_leaves_before_its_whole_flac_file_cancels_its_synthesis(server):
    """FLAC is answered whole, so nothing is written until the end: the handler notices the client
    has gone at the next chunk and cancels, instead of synthesizing the rest for nobody."""
    before, stats = sessions_ended(server, "cancelled"), server.stats()
    started, tokens = stats["scheduler"]["total_sessions"], stats["total_tokens"]

    async def leave():
        host, port = server.http.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        body = json.dumps({"input": "Nobody will hear this.", "response_format": "flac", "max_tokens": 1000,
                           "min_tokens": 1000}).encode()  # (what the server's 1024-token slots hold)
        writer.write(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    asyncio.run(leave())
    until(lambda: sessions_ended(server, "cancelled") > before, what="the synthesis to end as cancelled")
    stats = server.eventually_idle()
    assert stats["scheduler"]["total_sessions"] == started + 1
    assert stats["total_tokens"] - tokens < 1000  # it stopped before the 1000 tokens asked for


def test_info_endpoints(server):
    status, health = server.get("/health")
    assert status == 200 and health["status"] == "ok" and health["demo"] is True
    status, voices = server.get("/v1/voices")
    assert [v["name"] for v in voices["voices"]][:2] == ["tara", "leah"] and voices["default"] == "tara"
    stats = server.stats()
    assert set(stats) >= {"scheduler", "kv_cache", "total_tokens", "total_batches"}
    assert set(stats["scheduler"]) >= {"total_sessions", "active_sessions", "pending_sessions", "max_concurrent"}
    assert set(stats["kv_cache"]) == {"used_slots", "free_slots"}
    assert stats["engine"]["backend"] == "torch"  # auto, with no GPU and no engine here
    assert stats["codec"]["mode"] == "stream" and stats["codec"]["runtime"] == "onnxruntime"
    assert set(stats["codec"]) >= {"frames_decoded", "frames_emitted", "decoded_per_emitted", "open_states",
                                   "decode_ms_per_emitted_frame"}
    status, text = server.get("/metrics")
    assert status == 200 and "lyre_ttfb_seconds_bucket" in text and "lyre_kv_slots_used" in text
    assert "lyre_codec_frames_decoded_total" in text and "lyre_codec_frames_emitted_total" in text
    for executor_only in ("lyre_engine_iteration_latency_ms", "lyre_kv_cache_blocks", "lyre_engine_queued_requests"):
        assert executor_only not in text  # TensorRT-LLM's figures: absent on the torch backend


def test_codec_counters_follow_the_audio(server, openai_client):
    before = server.stats()["codec"]
    audio = openai_client.audio.speech.create(model="orpheus", voice="tara", input="Count my frames.",
                                              response_format="pcm").content
    after = server.eventually_idle()["codec"]
    frames = len(audio) / 2 / 2048
    assert after["frames_emitted"] - before["frames_emitted"] == frames == MAX_TOKENS / 7
    decoded = after["frames_decoded"] - before["frames_decoded"]
    warmup = 1 + 2 + 3 + 4  # at most a prefix decode at each of the first codec.warmup_frames (4) frames
    assert frames <= decoded <= frames + warmup + 3  # and the closing padding
    metrics = server.get("/metrics")[1]
    emitted_total = next(float(line.split()[1]) for line in metrics.splitlines()
                         if line.startswith("lyre_codec_frames_emitted_total"))
    assert emitted_total == pytest.approx(after["frames_emitted"], abs=1e-3)  # stats rounds to 3 decimals


def test_abrupt_disconnects_mid_stream_free_every_slot(server):
    async def go():
        body = {"input": "A long answer that the caller hangs up on.", "voice": "tara", "response_format": "pcm",
                "max_tokens": 700}
        for _ in range(6):
            async with aiohttp.ClientSession() as s:
                r = await s.post(server.http + "/v1/audio/speech", json=body)
                assert r.status == 200
                await r.content.readany()  # the first audio arrives ...
                r.close()  # ... and the caller hangs up

    asyncio.run(go())
    stats = server.eventually_idle()
    assert stats["kv_cache"]["free_slots"] == 8 and stats["codec"]["open_states"] == 0
    assert server.get("/health")[0] == 200


def test_openai_voice_names_any_case_speak_as_their_orpheus_voice(openai_client):
    """Clients that only know OpenAI's voices (Pipecat's default is "alloy") get audio: each name is
    an alias of an Orpheus voice, in any case; the same seed gives the aliased voice's very audio."""
    speak = lambda voice: openai_client.audio.speech.create(  # noqa: E731
        model="tts-1", voice=voice, input="Hello world", response_format="pcm", extra_body={"seed": 5}).content
    tara = speak("tara")
    for voice in ("alloy", "ALLOY", "Tara"):
        assert same_speech(speak(voice), tara), voice
    others = ("ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar")
    with concurrent.futures.ThreadPoolExecutor(8) as callers:  # (8 at a time: the server's slots)
        for voice, pcm in zip(others, callers.map(speak, others), strict=True):
            assert len(pcm) == 4 * 2048 * 2, voice


def test_unknown_voice_names_the_voices_and_their_aliases(openai_client):
    import openai

    with pytest.raises(openai.NotFoundError) as refused:
        openai_client.audio.speech.create(model="tts-1", voice="nobody", input="Hi")
    message = refused.value.body["message"]
    assert "tara" in message and "alloy" in message


def test_every_response_names_its_request_and_models_answer_like_openai(server, openai_client):
    response = openai_client.audio.speech.with_raw_response.create(model="tts-1", voice="nova", input="Hi there",
                                                                   response_format="wav")
    assert response.headers["x-request-id"].startswith("req_") and response.http_response.status_code == 200
    models = openai_client.models.list()
    assert {"tts-1", "lyre"} <= {m.id for m in models.data} and all(m.object == "model" for m in models.data)
    for m in models.data:  # the checkpoint's id has a slash in it
        assert openai_client.models.retrieve(m.id) == m
    with pytest.raises(openai.NotFoundError, match="no model .whisper-1."):
        openai_client.models.retrieve("whisper-1")

    async def fetch():
        async with aiohttp.ClientSession() as s:
            async with s.get(server.http + "/v1/nothing", headers={"X-Request-Id": "trace-42"}) as r:
                mine = (r.status, r.headers.get("X-Request-Id"))
            async with s.get(server.http + "/health", headers={"X-Request-Id": "bad id\u00e9" * 30}) as r:
                fresh = r.headers.get("X-Request-Id")
            async with s.ws_connect(server.http + "/v1/audio/stream") as ws:
                handshake = ws._response.headers.get("X-Request-Id")
        return mine, fresh, handshake

    mine, fresh, handshake = asyncio.run(fetch())
    assert mine == (404, "trace-42")  # the client's own id comes back, on errors too
    assert fresh.startswith("req_") and handshake.startswith("req_")
    status, voices = server.get("/v1/voices")
    assert next(v for v in voices["voices"] if v["name"] == "tara")["aliases"] == ["alloy"]
