"""The voice-agent stacks' own OpenAI TTS plugins, unchanged but for the base URL, get audio from Lyre:
LiveKit Agents' ``livekit-plugins-openai`` (``TTS.synthesize`` with its defaults: model
gpt-4o-mini-tts, voice "ash", mp3 over SSE) and Pipecat's ``OpenAITTSService.run_tts`` (voice
"alloy", 24 kHz PCM)."""

from __future__ import annotations

import asyncio

import numpy as np

from tests.support.servers import SECONDS


def test_livekit_openai_plugin_with_its_defaults(server):
    from livekit.plugins import openai as livekit_openai

    async def go():
        tts = livekit_openai.TTS(base_url=server.http + "/v1", api_key="unused")
        try:
            async with tts.synthesize("Hello from a LiveKit agent.") as stream:
                return [event async for event in stream]
        finally:
            await tts.aclose()

    events = asyncio.run(go())
    frames = [e.frame for e in events]
    pcm = np.concatenate([np.frombuffer(f.data, dtype=np.int16) for f in frames])
    assert frames[0].sample_rate == 24000 and frames[0].num_channels == 1
    assert abs(len(pcm) / 24000 - SECONDS) < 0.08 and np.abs(pcm).max() > 0  # mp3 decoded by the plugin
    assert events[0].request_id.startswith("req_")  # X-Request-Id: LiveKit warns without it


def test_pipecat_openai_tts_service_with_its_default_voice(server):
    from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame
    from pipecat.services.openai.tts import OpenAITTSService

    async def go():
        service = OpenAITTSService(api_key="unused", base_url=server.http + "/v1", sample_rate=24000)
        service._sample_rate = 24000  # what its setup() does in a running pipeline (needs a clock and task manager)
        return [frame async for frame in service.run_tts("Hello from a Pipecat bot.", "context-1")]

    frames = asyncio.run(go())
    assert not [f for f in frames if isinstance(f, ErrorFrame)], frames
    audio = b"".join(f.audio for f in frames if isinstance(f, TTSAudioRawFrame))
    assert abs(len(audio) / 2 / 24000 - SECONDS) < 0.01 and audio.count(0) < len(audio)
