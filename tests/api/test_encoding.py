"""Compressed formats are encoded off the event loop: a stalled mp3 encoder holds up nobody else.
(An in-process server, so the encoder can be made to stall; the service is the real one.)"""

from __future__ import annotations

import asyncio
import threading

import aiohttp
from aiohttp import web

from lyre.api.common import InFlight
from lyre.api.http.app import create_app
from lyre.audio.formats import AudioEncoder
from tests.support.services import run, service


def test_a_stalled_mp3_encoder_does_not_hold_up_a_pcm_stream(monkeypatch):
    stalled, release = threading.Event(), threading.Event()
    timed_out = []
    encode = AudioEncoder.encode

    def slow_encode(self, pcm, last=False):
        if self.format == "mp3":
            stalled.set()
            if not release.wait(timeout=20):  # on the event loop, this would block every other stream
                timed_out.append(True)
        return encode(self, pcm, last)

    monkeypatch.setattr(AudioEncoder, "encode", slow_encode)

    async def go():
        async with service() as tts:
            runner = web.AppRunner(create_app(tts, InFlight()))
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/audio/speech"
            try:
                async with aiohttp.ClientSession() as s:
                    async def fetch(fmt: str) -> bytes:
                        async with s.post(url, json={"input": "Hello there.", "response_format": fmt}) as r:
                            assert r.status == 200
                            return await r.read()

                    mp3 = asyncio.create_task(fetch("mp3"))
                    await asyncio.to_thread(stalled.wait, 20)  # the mp3 stream's encoder is stuck now
                    pcm = await fetch("pcm")  # ... and this stream is served meanwhile, start to end
                    release.set()
                    return len(pcm), len(await mp3)
            finally:
                release.set()
                await runner.cleanup()

    pcm_bytes, mp3_bytes = run(go())
    assert not timed_out and pcm_bytes == 6 * 2048 * 2 and mp3_bytes > 0
