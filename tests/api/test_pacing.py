"""A client that reads at playback speed, through a real server, to the end of a long utterance."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from tests.support.servers import start_server, stop_server

TOKENS = 7 * 60  # 60 frames: 5.1 s of audio, longer than every timeout below
BYTES_PER_S = 48_000  # 24 kHz s16le: playback speed


def test_a_client_reading_at_playback_speed_hears_a_long_utterance_to_the_end(demo_dir):
    # Before: session_timeout_s counted from creation (this stream would be cut after 2 s) and unread
    # chunks counted as slowness. Now only falling behind the listener's clock, or making no progress, does.
    server = start_server(f"sampling.max_tokens={TOKENS}", f"sampling.min_tokens={TOKENS}",
                          "scheduler.session_timeout_s=2.0", "scheduler.consumer_timeout_s=1.0",
                          "scheduler.max_buffer_s=0.5")
    try:
        async def listen() -> tuple[int, float]:
            body = {"input": "A long story, told at the speed it is heard.", "voice": "tara", "response_format": "pcm"}
            got, start = 0, None
            async with aiohttp.ClientSession() as s, s.post(server.http + "/v1/audio/speech", json=body) as r:
                assert r.status == 200
                while chunk := await r.content.read(4800):  # 50 ms of audio at a time
                    start = start or time.monotonic()
                    got += len(chunk)
                    ahead = got / BYTES_PER_S - (time.monotonic() - start)
                    if ahead > 0:
                        await asyncio.sleep(ahead)  # the client's own pace: playback speed, never faster
            return got, time.monotonic() - start

        got, seconds = asyncio.run(listen())
        assert got == TOKENS // 7 * 2048 * 2  # every frame, nothing cut off
        assert seconds > 2.0 + 1.0  # it outlived session_timeout_s and consumer_timeout_s several times over
        stats = server.eventually_idle()
        assert stats["scheduler"]["total_sessions"] == 1 and stats["codec"]["open_states"] == 0
        assert "slow_consumer" not in server.log() and "timeout" not in server.get("/metrics")[1].split(
            "lyre_sessions_total")[-1]
    finally:
        assert stop_server(server) == 0
