"""POST /v1/audio/verify against the real server: its own outputs (WAV, MP3, mu-law in WAV) carry
the mark; other audio does not; bad uploads get a clear error."""

from __future__ import annotations

import io
import socket
import struct

import numpy as np
import requests
import soundfile
from openai import OpenAI

from tests.support.audio_files import audio_file, speechlike


def verify(server, **kwargs) -> tuple[int, dict]:
    r = requests.post(server.http + "/v1/audio/verify", timeout=60, **kwargs)
    return r.status_code, r.json()


def mulaw_wav(g711: bytes) -> bytes:
    """Raw 8 kHz mu-law (the server's ``mulaw`` format) in a WAV container (format tag 7), unchanged."""
    fmt = struct.pack("<HHIIHH", 7, 1, 8000, 8000, 1, 8)
    return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(g711)) + b"WAVE" + b"fmt " + struct.pack("<I", len(fmt))
            + fmt + b"data" + struct.pack("<I", len(g711)) + g711)


def test_the_servers_outputs_are_found_marked_and_other_audio_is_not(server):
    client = OpenAI(base_url=server.http + "/v1", api_key="unused")
    text = "A long enough sentence to carry the mark through every format, and then some more words."
    wav = client.audio.speech.create(model="tts-1", voice="tara", input=text, response_format="wav",
                                     extra_body={"max_tokens": 280, "min_tokens": 280}).content
    mp3 = client.audio.speech.create(model="tts-1", voice="tara", input=text, response_format="mp3",
                                     extra_body={"max_tokens": 280, "min_tokens": 280}).content
    mulaw = requests.post(server.http + "/v1/audio/speech", timeout=60, json={
        "input": text, "response_format": "mulaw", "max_tokens": 280, "min_tokens": 280}).content  # 8 kHz G.711
    for label, kwargs in (("wav body", {"data": wav, "headers": {"Content-Type": "audio/wav"}}),
                          ("mp3 form", {"files": {"audio": ("out.mp3", mp3, "audio/mpeg")}}),
                          ("mu-law", {"data": mulaw_wav(mulaw)})):
        status, body = verify(server, **kwargs)
        assert status == 200 and body["watermarked"] is True and body["score"] >= body["threshold"], (label, body)
        assert abs(body["seconds"] - 40 * 2048 / 24000) < 0.1
    status, body = verify(server, data=audio_file(speechlike(3.0, 16000), 16000, "wav"))
    assert status == 200 and body["watermarked"] is False and body["score"] < body["threshold"]


def test_bad_uploads_get_a_clear_error(server):
    assert verify(server, data=b"")[0] == 400
    status, body = verify(server, data=b"not audio" * 50)
    assert status == 422 and body["error"]["code"] == "invalid_audio"
    status, body = verify(server, files={"wrong": ("x.wav", b"RIFF", "audio/wav")})
    assert status == 400 and "'audio'" in body["error"]["message"]
    eight = io.BytesIO()  # 8 channels: refused from its header, before its samples are decoded
    soundfile.write(eight, np.zeros((16000, 8), np.float32), 16000, format="WAV", subtype="PCM_16")
    status, body = verify(server, data=eight.getvalue())
    assert status == 422 and "8 channels; at most 2" in body["error"]["message"]


def test_a_tempo_change_keeps_the_mark_and_a_large_raw_body_is_read_whole(server):
    client = OpenAI(base_url=server.http + "/v1", api_key="unused")
    for speed in (0.8, 1.25):
        wav = client.audio.speech.create(model="tts-1", voice="tara", input="Faster or slower, still marked.",
                                         response_format="wav", speed=speed,
                                         extra_body={"max_tokens": 280, "min_tokens": 280}).content
        status, body = verify(server, data=wav)
        assert status == 200 and body["watermarked"] is True, (speed, body)
    long_wav = audio_file(speechlike(20.0, 24000), 24000, "wav")  # 960 kB: arrives in many reads
    status, body = verify(server, data=long_wav, headers={"Content-Type": "application/octet-stream"})
    assert status == 200 and abs(body["seconds"] - 20.0) < 0.01


def test_a_playlist_that_names_other_files_is_not_opened(server):
    """FFmpeg's concat and playlist formats read the files they name: uploads may not be those."""
    for upload in (b"ffconcat version 1.0\nfile README.md\n", b"#EXTM3U\n#EXTINF:1,\nREADME.md\n"):
        status, body = verify(server, data=upload)
        assert status == 422 and body["error"]["code"] == "invalid_audio", body


def test_uploads_that_stall_mid_body_hold_no_place(server):
    """Two verifications decode at once; an upload that stops sending holds its connection only."""
    host, port = server.http.removeprefix("http://").rsplit(":", 1)
    stalled = []
    try:
        for _ in range(3):  # more than the places
            s = socket.create_connection((host, int(port)), timeout=30)
            s.sendall(b"POST /v1/audio/verify HTTP/1.1\r\nHost: x\r\nContent-Type: audio/wav\r\n"
                      b"Content-Length: 500000\r\n\r\nRIFF")  # ... and nothing more
            stalled.append(s)
        status, body = verify(server, data=audio_file(speechlike(3.0, 16000), 16000, "wav"))
        assert status == 200 and body["watermarked"] is False, body
    finally:
        for s in stalled:
            s.close()
