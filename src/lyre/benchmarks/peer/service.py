"""The llama.cpp peer behind Lyre's own front ends (``production_server.py --baseline llamacpp``):
what an Orpheus user on a CPU runs — llama.cpp generating tokens for every caller at once
(:mod:`.llamacpp`), each caller's SNAC decoded over a sliding window in its own worker thread
(:mod:`.snac_window`) — measured through the same REST, WebSocket and gRPC protocol as Lyre.

The GGUF is exported from the configured checkpoint on first use and cached under
``<data_dir>/peer/``: f32 for ``model.quantize: none``, q8_0 for ``int8`` (the pairs the issue
compares). Its parallel sequences are ``scheduler.max_concurrent_sessions``, each of
``kv_cache.max_seq_len`` tokens; requests beyond wait in order, as ``llama-server`` queues them.
It exists to be compared against; it is not a serving mode: no cloned voices, audit, watermark,
timestamps or playback pacing, as the servers it stands for have none.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from lyre.codec import configure_noise
from lyre.core.stats import SessionMetrics, StatsSnapshot
from lyre.engine.backend import BackendChoice
from lyre.errors import SynthesisFailed
from lyre.model import checkpoint, orpheus
from lyre.service.stream import AudioChunk
from lyre.service.tts import TTSService

from .common import PeerStream, peer_stats
from .gguf_export import export_cached
from .llamacpp import LlamaCpp, PeerSampling, PeerSequence, import_llama_cpp
from .snac_window import SlidingWindowDecoder


class _Generation(threading.Thread):
    """The one thread that steps llama.cpp: admits waiting sequences while ids are free, then steps."""

    def __init__(self, llama: LlamaCpp):
        super().__init__(name="llamacpp-peer", daemon=True)
        self.llama = llama
        self.waiting: deque[PeerSequence] = deque()
        self.cond = threading.Condition()
        self.stopped = False
        self.tokens = 0

    def submit(self, seq: PeerSequence) -> None:
        with self.cond:
            self.waiting.append(seq)
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()

    def run(self) -> None:
        while True:
            with self.cond:
                while not self.stopped and not self.waiting and not self.llama.running:
                    self.cond.wait()
                if self.stopped:
                    break
                while self.waiting and self.llama.free_ids:
                    seq = self.waiting.popleft()
                    if seq.cancelled:
                        continue
                    try:
                        self.llama.admit(seq)
                    except ValueError as e:
                        seq.fail(str(e))
            try:
                self.tokens += self.llama.step()
            except Exception as e:  # noqa: BLE001 - a failed step fails the requests in it, not the thread
                for seq in list(self.llama.running):
                    seq.cancelled = True
                    seq.fail(f"{type(e).__name__}: {e}")
        with self.cond:  # stopped: whoever still waits is told so
            for seq in [*self.waiting, *self.llama.running]:
                seq.fail("the peer is shutting down")
            self.waiting.clear()
        self.llama.close()


class _PeerStream(PeerStream):
    """One synthesis: its segments generated one after another, audio from the sliding window."""

    def __init__(self, service: LlamaCppBaseline, prompts: list[list[int]], sampling: PeerSampling):
        super().__init__(service, prompts, sampling, "p")
        self._gen = self._chunks()
        self._seq: PeerSequence | None = None

    async def __anext__(self) -> AudioChunk:
        if self._cancelled:
            raise StopAsyncIteration
        return await self._gen.__anext__()

    async def _chunks(self):
        loop = asyncio.get_running_loop()
        svc = self._service
        offset = index = tokens = late = 0
        first_at: float | None = None
        for n, prompt in enumerate(self._prompts):
            inbox: asyncio.Queue = asyncio.Queue()

            def deliver(new: list[int], finished: bool, error: str | None = None, box=inbox) -> None:
                loop.call_soon_threadsafe(box.put_nowait, (new, finished, error))

            self._seq = PeerSequence(prompt, self._sampling, on_tokens=deliver)
            svc.generation.submit(self._seq)
            parser, window = orpheus.AudioTokenParser(), SlidingWindowDecoder(svc.snac)
            finished = False
            while not finished:
                new, finished, error = await inbox.get()
                if error:
                    raise SynthesisFailed(error)
                tokens += len(new)
                frames = parser.feed(new)
                if not frames:
                    continue
                for pcm in await asyncio.to_thread(window.feed, frames):  # their decode thread per request
                    now = time.monotonic()
                    if first_at is None:
                        first_at = now
                    is_late = now > first_at + offset / orpheus.SAMPLE_RATE + 1e-3
                    late += is_late
                    yield AudioChunk(pcm=pcm, sample_rate=orpheus.SAMPLE_RATE, offset_samples=offset, index=index,
                                     elapsed_ms=1000 * (now - self._created), late=is_late, segment=n)
                    offset += len(pcm)
                    index += 1
        elapsed = time.monotonic() - self._created
        seconds = offset / orpheus.SAMPLE_RATE
        self.metrics = SessionMetrics(
            ttfb_ms=1000 * (first_at - self._created) if first_at else None, tokens=tokens,
            prompt_tokens=sum(map(len, self._prompts)), audio_seconds=seconds, elapsed_s=elapsed,
            real_time_factor=elapsed / seconds if seconds else None, chunks=index, late_chunks=late,
            segments=len(self._prompts))

    def cancel(self) -> None:
        self._cancelled = True
        if self._seq is not None:
            self._seq.cancelled = True

    async def aclose(self) -> None:
        self.cancel()
        await self._gen.aclose()


class LlamaCppBaseline(TTSService):
    """Same validation and API as ``TTSService``; generation is llama.cpp, decoding the sliding window."""

    def _load(self) -> None:
        import_llama_cpp()  # (before the export: a missing extra is said at once)
        cfg = self.config
        self.model = checkpoint.resolve_model(cfg.model, cfg.codec)
        self.tokenizer = checkpoint.load_tokenizer(self.model.llama_dir)
        self.gguf_kind = {"none": "f32", "int8": "q8_0"}[cfg.model.quantize]
        self.gguf = export_cached(self.model.llama_dir, self.gguf_kind, Path(cfg.data_dir) / "peer")
        self.capacity = cfg.scheduler.max_concurrent_sessions
        llama = LlamaCpp(self.gguf, self.capacity, cfg.kv_cache.max_seq_len)
        self.snac = configure_noise(checkpoint.load_snac(self.model.snac_dir, "cpu"), cfg.codec.noise,
                                    cfg.codec.noise_seed)
        self.generation = _Generation(llama)
        self.generation.start()
        self.total_sessions = 0
        self._ids = itertools.count()
        self._running = True
        self.backend = BackendChoice("llamacpp", f"the benchmark peer: llama.cpp ({self.gguf_kind} GGUF, "
                                                 f"{self.capacity} parallel sequences) + SNAC over a sliding window")

    async def __aenter__(self) -> LlamaCppBaseline:
        await asyncio.to_thread(self._load)
        return self

    async def aclose(self) -> None:
        if getattr(self, "_running", False):
            self._running = False
            self.generation.stop()
            await asyncio.to_thread(self.generation.join)

    @property
    def ready(self) -> bool:
        return getattr(self, "_running", False)

    def stream(self, text: str, voice: str | None = None, *, account: str = "default", protocol: str = "library",
               audit: Any = None, mark: Any = None, tempo: float = 1.0, **sampling: Any) -> _PeerStream:
        """(Built-in voices only; ``tempo`` means nothing to the peer: it paces nothing.)"""
        segments, p, _ = self._prepare(text, self._voice(voice, account), sampling, account)
        self.total_sessions += 1
        seed = p.seed if p.seed is not None else int(np.random.default_rng().integers(2**31))
        params = PeerSampling(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                              repetition_penalty=p.repetition_penalty, max_tokens=p.max_tokens, seed=seed,
                              constrain_audio=p.constrain_audio)
        return _PeerStream(self, [s.prompt for s in segments], params)

    def stats(self) -> StatsSnapshot:
        llama, gen = self.generation.llama, self.generation
        return peer_stats("llamacpp", "llama.cpp slots", self.capacity, len(llama.running), len(gen.waiting),
                          self.total_sessions, gen.tokens, llama.steps)
