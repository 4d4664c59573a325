"""Lyre as a Pipecat TTS service, with word timestamps: an interrupted bot's context keeps only the
words the listener heard.

    from lyre.integrations.pipecat import LyreTTSService

    tts = LyreTTSService(url="ws://localhost:8000/v1/audio/stream", api_key=os.environ.get("LYRE_API_KEY"),
                         voice="tara")
    pipeline = Pipeline([transport.input(), stt, user_aggregator, llm, tts, transport.output(),
                         assistant_aggregator])

It speaks Lyre's WebSocket (``GET /v1/audio/stream``): each Pipecat turn is one Lyre context (its
``context_id``); each sentence Pipecat hands over is appended and flushed, so it starts at once; the
turn's end ends the context. Lyre sends a ``timestamps`` message after each text piece's audio, with
its estimated words' start times from the start of the context's audio, which is what
``add_word_timestamps`` takes: Pipecat's output transport releases each word when its audio plays,
and its assistant aggregator, on an interruption, records only the words released. The interruption
cancels the Lyre context at once (its KV slot is freed); Lyre answers with its report of the audio it
had *sent* (Pipecat knows what was played; the service does not), kept in ``heard`` for the last
HEARD_KEPT contexts and passed to the ``on_heard`` event's handlers.

Needs ``pip install 'lyre-tts[pipecat]'`` (pipecat-ai 1.14 or newer); nothing else of Lyre is
imported, so it runs in the agent's process, not the server's.
"""

from __future__ import annotations

import base64
import json
from collections import OrderedDict
from collections.abc import AsyncGenerator
from typing import Any

from loguru import logger
from pipecat.frames.frames import ErrorFrame, Frame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import WebsocketTTSService
from websockets.protocol import State

HEARD_KEPT = 64  # interrupted turns whose report is kept in LyreTTSService.heard


class LyreTTSService(WebsocketTTSService):
    """Pipecat TTS over Lyre's WebSocket, with word timestamps.

    ``url``: the server's WebSocket, ``ws(s)://host:port/v1/audio/stream``. ``api_key``: an API key (sent
    as ``Authorization: Bearer``; a server process may hold one) or none for a keyless server.
    ``voice``: a built-in voice or a cloned voice's id. ``options``: more settings for each context
    (sampling such as ``temperature`` or ``seed``; Lyre's WebSocket fields)."""

    def __init__(self, *, url: str = "ws://localhost:8000/v1/audio/stream", api_key: str | None = None,
                 voice: str = "tara", sample_rate: int | None = None, options: dict[str, Any] | None = None,
                 **kwargs: Any):
        kwargs.setdefault("settings", TTSSettings(model=None, voice=voice, language=None))
        super().__init__(push_text_frames=False, push_start_frame=True, pause_frame_processing=False,
                         sample_rate=sample_rate, **kwargs)
        self._url, self._api_key, self._voice = url, api_key, voice
        self._options = dict(options or {})
        self._receive_task = None
        self.heard: OrderedDict[str, dict] = OrderedDict()  # context id -> Lyre's report of an interrupted turn
        self._register_event_handler("on_heard")  # (service, context id, report): a turn's report came

    def can_generate_metrics(self) -> bool:
        return True

    # --- the connection -------------------------------------------------------------------------

    async def setup(self, setup: Any) -> None:
        await super().setup(setup)
        await self._connect()

    async def _connect(self) -> None:
        await super()._connect()
        await self._connect_websocket()
        if self._websocket and not self._receive_task:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()
        if self._receive_task:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        if self._websocket and self._websocket.state is State.OPEN:
            return
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            self._websocket = await self._websocket_connect(self._url, additional_headers=headers)
            await self._call_event_handler("on_connected")
        except Exception as e:  # noqa: BLE001 - reported to the pipeline, which decides what follows
            self._websocket = None
            await self.push_error(error_msg=f"cannot connect to Lyre at {self._url}: {e}", exception=e)
            await self._call_event_handler("on_connection_error", f"{e}")

    async def _disconnect_websocket(self) -> None:
        try:
            await self.stop_all_metrics()
            if self._websocket:
                await self._websocket.close()
        finally:
            self._websocket = None
            await self._call_event_handler("on_disconnected")

    async def _send(self, message: dict) -> None:
        if not self._websocket or self._websocket.state is not State.OPEN:
            await self._connect()
        await self._websocket.send(json.dumps(message))

    # --- text in --------------------------------------------------------------------------------

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Append a sentence to the turn's context and speak it now (the audio comes by the receive loop)."""
        settings = {"voice": self._voice, "response_format": "pcm", "sample_rate": self.sample_rate,
                    "timestamps": "words", **self._options}
        try:
            await self._send({"context_id": context_id, "append": text, "flush": True, **settings})
            await self.start_tts_usage_metrics(text)
        except Exception as e:  # noqa: BLE001 - this sentence fails; the pipeline goes on
            yield ErrorFrame(error=f"Lyre: {e}")
            yield TTSStoppedFrame(context_id=context_id)
            return
        yield None

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn is over: its context ends after its audio."""
        ctx = context_id or self.get_active_audio_context_id()
        if ctx and self._websocket:
            await self._send({"context_id": ctx, "end": True})

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """A barge-in: the context is cancelled at once (Lyre frees its slot and reports what was sent)."""
        await self.stop_all_metrics()
        if context_id and self._websocket:
            await self._send({"context_id": context_id, "cancel": True})
        await super().on_audio_context_interrupted(context_id)

    # --- audio and timestamps out ---------------------------------------------------------------

    async def _receive_messages(self) -> None:
        async for raw in self._websocket:
            await self._handle(json.loads(raw))

    async def _handle(self, msg: dict) -> None:
        ctx = msg.get("context_id")
        if msg.get("cancelled"):
            if "heard" in msg and ctx is not None:
                self.heard[ctx] = msg["heard"]
                while len(self.heard) > HEARD_KEPT:
                    self.heard.popitem(last=False)
                logger.debug(f"{self}: context {ctx} heard up to character {msg['heard']['end_char']}")
                await self._call_event_handler("on_heard", ctx, msg["heard"])
            return
        if ctx is None or not self.audio_context_available(ctx):
            if "error" in msg:
                await self.push_error(error_msg=f"Lyre: {msg['error'].get('message')}")
            return  # (a context already interrupted: its late messages are dropped)
        if msg.get("type") == "audio":
            await self.stop_ttfb_metrics()
            await self.append_to_audio_context(ctx, TTSAudioRawFrame(
                audio=base64.b64decode(msg["audio"]), sample_rate=self.sample_rate, num_channels=1, context_id=ctx))
        elif msg.get("type") == "timestamps":
            words = msg.get("word_timestamps") or {"words": [], "start": []}
            await self.add_word_timestamps(list(zip(words["words"], words["start"], strict=True)), ctx)
        elif msg.get("done"):
            await self.append_to_audio_context(ctx, TTSStoppedFrame(context_id=ctx))
            await self.remove_audio_context(ctx)
        elif "error" in msg:
            await self.append_to_audio_context(ctx, TTSStoppedFrame(context_id=ctx))
            await self.remove_audio_context(ctx)
            await self.push_error(error_msg=f"Lyre: {msg['error'].get('message')}")
