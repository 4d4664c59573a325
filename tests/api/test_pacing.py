"""A client that reads at playback speed, through a real server, to the end of a long utterance."""

from __future__ import annotations

import time

from tests.support.servers import serve_in_process, slow_requests

# 108 frames: 9.2 s of audio, longer than every timeout below, and than what the sockets between the
# server and this client hold (~4 s) plus the 3.5 s it has read when it asks whether the server is
# still at work
TOKENS = 7 * 108
BYTES_PER_S = 48_000  # 24 kHz s16le: playback speed


def test_a_client_reading_at_playback_speed_hears_a_long_utterance_to_the_end(demo_dir):
    # Before: session_timeout_s counted from creation (this stream would be cut after 2 s) and unread
    # chunks counted as slowness. Now only falling behind the listener's clock, or making no progress, does.
    with serve_in_process(f"sampling.max_tokens={TOKENS}", f"sampling.min_tokens={TOKENS}",
                          "scheduler.session_timeout_s=2.0", "scheduler.consumer_timeout_s=1.0",
                          "scheduler.max_buffer_s=0.5") as server:
        body = {"input": "A long story, told at the speed it is heard.", "voice": "tara", "response_format": "pcm"}
        got, start, midway = 0, None, None
        # a slow reader's socket: the server waits on this client's reading (on loopback's default
        # buffers, the whole utterance would be in the sockets at once and the server long done)
        with slow_requests() as s, s.post(server.http + "/v1/audio/speech", json=body, stream=True, timeout=60) as r:
            assert r.status_code == 200
            for chunk in r.iter_content(4800):  # 50 ms of audio at a time
                start = start or time.monotonic()
                got += len(chunk)
                if midway is None and got > 3.5 * BYTES_PER_S:  # past both timeouts: is it still being made?
                    midway = server.stats()["scheduler"]
                ahead = got / BYTES_PER_S - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)  # the client's own pace: playback speed, never faster
        seconds = time.monotonic() - start
        assert got == TOKENS // 7 * 2048 * 2  # every frame, nothing cut off
        assert seconds > 2.0 + 1.0  # it outlived session_timeout_s and consumer_timeout_s several times over
        assert midway["active_sessions"] == 1  # the server waited on this client, past both timeouts
        stats = server.eventually_idle()
        assert stats["scheduler"]["total_sessions"] == 1 and stats["codec"]["open_states"] == 0
        assert "slow_consumer" not in server.log() and "timeout" not in server.get("/metrics")[1].split(
            "lyre_sessions_total")[-1]
        assert server.stop() == 0
