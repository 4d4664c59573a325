"""lyre.integrations.pipecat in a real Pipecat pipeline against a real Lyre server: the bot speaks a
turn, the caller barges in after the first word was played, and the bot's context keeps only the
words played — a prefix of what it meant to say, not all of it — while Lyre frees the slot."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.servers import STOP_TIMEOUT_S
from tests.support.ws import ws_url

pytest.importorskip("pipecat", reason="pipecat-ai is not installed (pip install '.[pipecat]')")

from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: E402
from pipecat.processors.aggregators.llm_context import LLMContext  # noqa: E402
from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.transports.base_output import BaseOutputTransport  # noqa: E402
from pipecat.transports.base_transport import TransportParams  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from lyre.integrations.pipecat import LyreTTSService  # noqa: E402

ANSWER = ["Well, let me think about that for a moment.", "The first thing to know is that it takes time.",
          "The second thing is that it costs nothing."]


class SilentOutput(BaseOutputTransport):
    """An output transport with no device: it takes audio at once; word frames still wait for their time."""

    async def write_audio_frame(self, frame) -> bool:
        return True

    async def start(self, frame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)


class Played(FrameProcessor):
    """After the output: the words it released (played), and the audio that went through."""

    def __init__(self):
        super().__init__()
        self.words: list[str] = []
        self.first_word = asyncio.Event()
        self.audio_bytes = 0

    async def process_frame(self, frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSTextFrame):
            self.words.append(frame.text)
            self.first_word.set()
        elif isinstance(frame, TTSAudioRawFrame):
            self.audio_bytes += len(frame.audio)
        await self.push_frame(frame, direction)


def test_an_interrupted_bot_keeps_only_the_words_played(server):
    async def go():
        context = LLMContext()
        tts = LyreTTSService(url=ws_url(server), voice="tara", sample_rate=24000,
                             options={"max_tokens": 280, "seed": 1})  # ~3.4 s of audio per sentence
        played = Played()
        aggregator = LLMAssistantAggregator(context)
        recorded, reported = asyncio.Event(), asyncio.Event()

        @tts.event_handler("on_heard")
        async def _reported(*_):
            reported.set()

        @aggregator.event_handler("on_assistant_turn_stopped")
        async def _recorded(*_):
            recorded.set()

        worker = PipelineWorker(Pipeline([tts, SilentOutput(TransportParams(audio_out_enabled=True)), played, aggregator]),
                                cancel_on_idle_timeout=False, params=PipelineParams())
        started = asyncio.Event()

        @worker.event_handler("on_pipeline_started")
        async def _started(worker, frame):
            started.set()

        async def drive():
            await asyncio.wait_for(started.wait(), STOP_TIMEOUT_S)
            await worker.queue_frames([LLMFullResponseStartFrame(), *(LLMTextFrame(s + " ") for s in ANSWER),
                                       LLMFullResponseEndFrame()])
            await asyncio.wait_for(played.first_word.wait(), STOP_TIMEOUT_S)  # the caller heard the bot begin
            await worker.queue_frame(InterruptionFrame())
            await asyncio.wait_for(recorded.wait(), STOP_TIMEOUT_S)  # the turn, as the interruption left it
            await asyncio.wait_for(reported.wait(), STOP_TIMEOUT_S)  # Lyre's answer to the cancel
            await worker.queue_frame(EndFrame())

        runner = WorkerRunner()
        await runner.add_workers(worker)
        await asyncio.wait_for(asyncio.gather(runner.run(), drive()), 3 * STOP_TIMEOUT_S)
        return context.get_messages(), played, tts.heard

    messages, played, heard = asyncio.run(go())
    said = next(m["content"] for m in messages if m.get("role") == "assistant").split()
    meant = " ".join(ANSWER).split()
    assert played.audio_bytes > 0 and said  # it spoke, and the context holds what was played ...
    assert said == meant[:len(said)] and len(said) < len(meant)  # ... a prefix of the answer, not all of it
    (report,) = heard.values()  # Lyre's own report of the cancelled context
    assert report["sent_s"] > 0
    assert server.eventually_idle()["kv_cache"]["free_slots"] == 8  # the cancel freed its slot
