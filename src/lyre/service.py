"""``TTSService``: the library API — text in, streaming 24 kHz PCM out — usable without any server.

    async with TTSService.from_config("config/model_config.yaml") as tts:
        async for chunk in tts.stream("Hello world", voice="tara"):
            play(chunk.pcm)                      # int16, 24 kHz, mono
        audio = await tts.synthesize("Bye now")  # whole result with metrics

One engine thread owns the scheduler, the token engine and the codec. The asyncio side validates
requests, takes a place at the admission gate (overload is refused at once), and talks to the
engine thread only by message; audio comes back through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lyre import checkpoint, orpheus
from lyre.admission import AdmissionGate, Overloaded
from lyre.codec import CodecError, StreamSettings, build_codec, configure_noise, resolve_runtime, warm_up
from lyre.config import LyreConfig, apply_overrides, load_config
from lyre.engine.backend import BackendError, Environment, check_manifest, probe_environment, select_backend
from lyre.engine.base import SamplingParams
from lyre.engine.torch_engine import TorchEngine, TorchEngineConfig
from lyre.errors import (
    InvalidRequest,
    LyreError,
    OutOfRange,
    OverloadedError,
    ServiceUnavailable,
    SynthesisCancelled,
    SynthesisFailed,
    SynthesisTimeout,
    TextTooLong,
    UnknownVoice,
    shorten,
)
from lyre.metrics import Metrics
from lyre.options import SynthesisRequest, parse
from lyre.pipeline import AudioPipeline
from lyre.scheduler import Scheduler
from lyre.session import CANCELLED, FAILED, FINISHED, ChunkEvent, Segment, Session
from lyre.text import MAX_SEGMENT_CHARS, split_text
from lyre.utterance import Utterance

log = logging.getLogger("lyre.service")


# the errors are defined in lyre.errors and importable from here too
__all__ = ["InvalidRequest", "LyreError", "OutOfRange", "OverloadedError", "ServiceUnavailable", "SynthesisCancelled",
           "SynthesisFailed", "SynthesisTimeout", "TextTooLong", "UnknownVoice", "TTSService", "SpeechStream",
           "Audio", "AudioChunk"]


# --------------------------------------------------------------------------------------------
# results


@dataclass
class AudioChunk:
    pcm: np.ndarray  # int16 mono
    sample_rate: int
    offset_samples: int  # of pcm[0] in the whole utterance
    index: int
    elapsed_ms: float  # request received -> this chunk delivered
    late: bool  # delivered after the audio before it had finished playing

    @property
    def seconds(self) -> float:
        return len(self.pcm) / self.sample_rate


@dataclass
class Audio:
    pcm: np.ndarray  # int16 mono
    sample_rate: int
    metrics: dict[str, Any] = field(default_factory=dict)  # ttfb_ms, tokens, audio_seconds, real_time_factor, ...

    @property
    def seconds(self) -> float:
        return len(self.pcm) / self.sample_rate


def to_int16(pcm: np.ndarray) -> np.ndarray:
    return (np.clip(pcm, -1.0, 1.0) * 32767.0).round().astype(np.int16)


# --------------------------------------------------------------------------------------------
# the engine thread


class EngineLoop:
    """The one thread that runs the scheduler. Work arrives as callables in its inbox."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.inbox: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="lyre-engine", daemon=True)
        self.alive = False
        self.closing = False
        self._lock = threading.Lock()
        self.error: BaseException | None = None

    def start(self) -> None:
        self.alive = True
        self.thread.start()

    def post(self, fn: Callable[[], None]) -> bool:
        """Queue ``fn`` for the engine thread; False (nothing queued) once the loop is closing or has
        stopped. Nothing is ever queued behind the stop message, so every queued ``fn`` runs."""
        with self._lock:
            if self.closing or not self.alive:
                return False
            self.inbox.put(fn)
            return True

    def request_stop(self) -> None:
        """Refuse new messages from now on; the loop runs what is queued, then shuts the scheduler down."""
        with self._lock:
            if not self.closing:
                self.closing = True
                self.inbox.put(None)

    def stop(self) -> None:
        self.request_stop()
        self.thread.join()

    def _run(self) -> None:
        try:
            idle_wait: float | None = None
            while True:
                for fn in self._take(block=not self.scheduler.has_work(), timeout=idle_wait):
                    if fn is None:
                        self.scheduler.shutdown()
                        return
                    try:
                        fn()
                    except Exception:  # a message about one request must not stop everyone's loop
                        log.exception("a message to the engine loop failed")
                progressed = self.scheduler.step() if self.scheduler.has_work() else False
                self.scheduler.publish()
                # Sessions are open but nothing moved (e.g. all waiting on their consumers): wait for
                # a message briefly instead of spinning.
                idle_wait = None if progressed else 0.002
        except BaseException as e:  # the loop must never die silently, nor leave anyone waiting
            log.exception("engine loop stopped")
            self.error = e
            self.alive = False
            try:
                self.scheduler.shutdown(FAILED, f"the engine loop stopped: {type(e).__name__}: {e}")
            except Exception:
                log.exception("could not fail the open sessions")
        finally:
            with self._lock:
                self.alive = False
                self.closing = True
            self._run_leftovers()

    def _run_leftovers(self) -> None:
        """Messages queued before the loop died: run against the shut-down scheduler (which ends a
        submitted session at once), so nobody waits for an answer that never comes."""
        for fn in self._take(block=False, timeout=None):
            if fn is not None:
                try:
                    fn()
                except Exception:
                    log.exception("a message to the stopped engine loop failed")

    def _take(self, block: bool, timeout: float | None) -> list[Callable[[], None] | None]:
        items = []
        try:
            if block:
                items.append(self.inbox.get())
            elif timeout:
                items.append(self.inbox.get(timeout=timeout))
            while True:
                items.append(self.inbox.get_nowait())
        except queue.Empty:
            pass
        return items


def _cpu_runtime(runtime: str, device: str) -> bool:
    """Does a CPU runtime of its own (onnxruntime, openvino) run the streaming codec? Then the codec
    and the engine can decode and step on separate cores at once (``codec.overlap: auto``)."""
    try:
        return resolve_runtime(runtime, device) != "torch"
    except CodecError:
        return False  # build_codec says why


# --------------------------------------------------------------------------------------------
# the service


class SpeechStream:
    """Async iterator over one utterance's :class:`AudioChunk` s; ``metrics`` is set at the end.
    Leaving the loop early (break, exception, aclose) cancels the synthesis and frees its slot."""

    def __init__(self, service: TTSService, session: Session, events: asyncio.Queue):
        self._service, self._session, self._events = service, session, events
        self.session_id = session.session_id
        self.metrics: dict[str, Any] | None = None
        self._done = False

    def __aiter__(self) -> SpeechStream:
        return self

    async def __anext__(self) -> AudioChunk:
        if self._done:
            raise StopAsyncIteration
        try:
            ev = await self._events.get()
        except BaseException:
            self.cancel()
            raise
        if isinstance(ev, ChunkEvent):
            self._session.consumed_samples += len(ev.pcm)
            return AudioChunk(
                pcm=to_int16(ev.pcm),
                sample_rate=orpheus.SAMPLE_RATE,
                offset_samples=ev.offset,
                index=ev.index,
                elapsed_ms=1000 * (time.monotonic() - self._session.created),
                late=ev.late,
            )
        self._done = True
        self.metrics = ev.metrics
        if ev.outcome == FINISHED:
            raise StopAsyncIteration
        if ev.outcome == CANCELLED and ev.reason == "shutdown":
            raise ServiceUnavailable("the service shut down before this synthesis finished")
        if ev.outcome == CANCELLED and ev.reason == "timeout":
            raise SynthesisTimeout("synthesis made no progress (no audio generated or read) for scheduler.session_timeout_s")
        if ev.outcome == CANCELLED:
            raise SynthesisCancelled(f"synthesis was cancelled ({ev.reason})")
        raise SynthesisFailed(ev.reason or "synthesis failed")

    def cancel(self) -> None:
        if not self._done:
            self._done = True
            self._service._cancel(self.session_id)

    async def aclose(self) -> None:
        self.cancel()


class TTSService:
    def __init__(self, config: LyreConfig):
        self.config = config
        self.metrics = Metrics()
        self.gate = AdmissionGate(config.scheduler.max_concurrent_sessions, config.scheduler.max_pending)
        self._ids = itertools.count()
        self._loop: EngineLoop | None = None
        self.scheduler: Scheduler | None = None
        self.model: checkpoint.ResolvedModel | None = None
        self.tokenizer: Any = None
        self.backend: Any = None  # BackendChoice once loaded

    @classmethod
    def from_config(cls, path_or_config: str | Path | LyreConfig | None = None, **overrides: Any) -> TTSService:
        """``overrides`` are dotted keys, e.g. ``**{"scheduler.max_batch_size": 8}`` or
        ``scheduler__max_batch_size=8``."""
        dotted = {k.replace("__", "."): v for k, v in overrides.items()}
        if isinstance(path_or_config, LyreConfig):
            return cls(apply_overrides(path_or_config, dotted))
        return cls(load_config(path_or_config, dotted))

    # --- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> TTSService:
        await asyncio.to_thread(self._load)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def _load(self) -> None:
        cfg = self.config
        env = probe_environment() if cfg.model.backend != "torch" else Environment()
        try:
            choice = select_backend(cfg.model.backend, cfg.build.engine_dir, env)
        except BackendError as e:
            raise LyreError(str(e)) from None
        self.model = checkpoint.resolve_model(cfg.model, cfg.codec)
        self.tokenizer = checkpoint.load_tokenizer(self.model.llama_dir)
        cores = os.cpu_count() or 2
        engine_threads = cfg.model.cpu_threads or max(1, cores // 2)
        if choice.name == "trtllm":
            engine, device, description = self._trtllm_engine(env)
        else:
            engine_cfg = TorchEngineConfig.from_config(cfg)
            if engine_cfg.device == "cpu":  # (process-wide: torch has one intra-op thread pool)
                torch.set_num_threads(engine_threads)
            engine = TorchEngine.from_checkpoint(self.model.llama_dir, engine_cfg)
            device, description = engine_cfg.device, f"torch on {engine_cfg.device} ({engine_cfg.dtype})"
        codec_device = cfg.codec.device if cfg.codec.device != "auto" else device
        on_gpu = codec_device == "cuda"
        codec_dtype = torch.float16 if (cfg.codec.fp16 and on_gpu) else torch.float32
        snac = checkpoint.load_snac(self.model.snac_dir, codec_device, codec_dtype)
        configure_noise(snac, cfg.codec.noise, cfg.codec.noise_seed)
        overlap = cfg.codec.overlap == "on" or (cfg.codec.overlap == "auto" and (on_gpu or (
            cfg.codec.mode == "stream" and cores >= 2 and _cpu_runtime(cfg.codec.runtime, codec_device))))
        # the CPU codec runtime's threads: every core between engine steps, the engine's spare cores beside them
        codec_threads = cfg.codec.cpu_threads or (max(1, cores - engine_threads) if overlap else cores)
        try:
            codec = build_codec(cfg.codec, snac, codec_device, codec_dtype, codec_threads)
        except CodecError as e:
            raise LyreError(str(e)) from None
        settings = StreamSettings(
            context_frames=cfg.codec.context_frames,
            first_flush_frames=cfg.scheduler.flush_first_n_tokens // orpheus.FRAME_TOKENS,
            every_flush_frames=cfg.scheduler.flush_every_n_tokens // orpheus.FRAME_TOKENS,
            max_chunk_frames=cfg.codec.max_chunk_frames,
            warmup_frames=cfg.codec.warmup_frames,
        )
        warm_up(codec, settings)  # the first caller does not pay the codec's first runs
        audio = AudioPipeline(codec, settings, cfg.codec.max_round_ms / 1000, self.metrics, overlap,
                              cfg.scheduler.first_chunk)
        self.scheduler = Scheduler(cfg.scheduler, engine, audio, self.gate, metrics=self.metrics)
        self._loop = EngineLoop(self.scheduler)
        self._loop.start()
        self.backend = choice
        log.info("engine: %s; %s; model %s%s", description, choice.reason, self.model.source,
                 " — DEMO, audio is noise" if self.model.is_demo else "")

    def _trtllm_engine(self, env: Environment) -> tuple[Any, str, str]:
        """The TensorRT-LLM engine of build.engine_dir, after checking its manifest against this machine."""
        from lyre.engine.trtllm_engine import TrtllmEngine, TrtllmEngineConfig

        cfg = self.config
        try:
            manifest = check_manifest(cfg.build.engine_dir, env)
        except BackendError as e:
            raise LyreError(str(e)) from None
        if self.model.is_demo and Path(manifest.model_source).resolve() != self.model.llama_dir.resolve():
            raise LyreError(
                f"the engine in {cfg.build.engine_dir} was built from {manifest.model_source}, but the tokenizer and "
                f"codec resolve to the demo checkpoint: set model.path to the checkpoint the engine was built from"
            )
        engine = TrtllmEngine(TrtllmEngineConfig.from_config(cfg, manifest))
        return engine, "cuda", (f"trtllm {manifest.quantization} engine {cfg.build.engine_dir} on {manifest.gpu_name} "
                                f"(TensorRT-LLM {manifest.tensorrt_llm_version}; not yet run on a GPU by this project)")

    async def aclose(self) -> None:
        """Stop: requests from now on get ServiceUnavailable at once; open sessions are cancelled."""
        if self._loop is not None and self._loop.thread.is_alive():
            await asyncio.to_thread(self._loop.stop)

    @property
    def ready(self) -> bool:
        return self._loop is not None and self._loop.alive and not self._loop.closing

    @property
    def voices(self) -> tuple[str, ...]:
        return self.config.model.voices

    # --- requests -------------------------------------------------------------------------------

    def stream(self, text: str, voice: str | None = None, **sampling: Any) -> SpeechStream:
        """Start synthesising ``text``; iterate the result for audio chunks as they are decoded.
        Raises InvalidRequest / UnknownVoice / TextTooLong / OverloadedError at once."""
        if not self.ready:
            raise ServiceUnavailable("the service is not running (use `async with TTSService...`)")
        prompts, params = self._prepare(text, voice, sampling)
        try:
            self.gate.enter()
        except Overloaded as e:
            self.metrics.rejections.labels(reason="overloaded").inc()
            raise OverloadedError(e.retry_after_s) from None
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        session = Session(
            session_id=f"s{next(self._ids)}",
            segments=[Segment(p) for p in prompts],
            sampling=params,
            sink=lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev),
            created=time.monotonic(),
        )
        if not self._loop.post(lambda: self.scheduler.submit(session)):
            self.gate.leave()
            raise ServiceUnavailable("the service is shutting down")
        return SpeechStream(self, session, events)

    async def synthesize(self, text: str, voice: str | None = None, **sampling: Any) -> Audio:
        """The whole utterance at once, with metrics."""
        stream = self.stream(text, voice, **sampling)
        parts = [chunk.pcm async for chunk in stream]
        pcm = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)
        return Audio(pcm=pcm, sample_rate=orpheus.SAMPLE_RATE, metrics=stream.metrics or {})

    def speak(self, text: str, voice: str | None = None, **sampling: Any) -> SpeechStream | Utterance:
        """One whole text as one ordered stream of chunks (REST, gRPC and Riva ``Synthesize``): a single
        synthesis when it fits the profile's ``max_text_chars``; longer text, up to
        ``server.max_input_chars``, is split into sentences by an :class:`Utterance`. Raises as
        :meth:`stream` does (an overload of a long text's first piece: on the first chunk)."""
        limit = self.config.active_profile.max_text_chars
        if not isinstance(text, str) or len(text) <= limit:
            return self.stream(text, voice, **sampling)
        most = max(limit, self.config.server.max_input_chars)
        if len(text) > most:
            raise TextTooLong(f"text has {len(text)} characters; at most {most} are accepted "
                              f"(server.max_input_chars; the '{self.config.profile}' profile speaks up to {limit} "
                              "as one synthesis)")
        if not text.strip():
            raise InvalidRequest("text is empty: there is nothing to speak")
        utterance = self.utterance(voice, **sampling)
        utterance.max_pending_chars = len(text)
        try:
            utterance.append(text)
        except BaseException:
            utterance.cancel()
            raise
        utterance.end()
        return utterance

    def _cancel(self, session_id: str) -> None:
        if self._loop is not None and self._loop.alive:
            self._loop.post(lambda: self.scheduler.cancel(session_id, "cancelled"))

    def utterance(self, voice: str | None = None, **sampling: Any) -> Utterance:
        """An utterance whose text arrives in pieces (``append`` / ``flush`` / ``end``), spoken as one
        ordered stream of chunks (iterate it). Raises InvalidRequest / UnknownVoice at once."""
        if not self.ready:
            raise ServiceUnavailable("the service is not running (use `async with TTSService...`)")
        self._options(parse(SynthesisRequest, {"text": "", "voice": voice, **sampling}))
        return Utterance(self, voice, sampling, self.config.active_profile.max_text_chars,
                         self.config.server.max_pending_text_chars)

    def _options(self, request: SynthesisRequest) -> tuple[str, SamplingParams]:
        """The voice and sampling parameters of a parsed request (the voice must exist)."""
        cfg = self.config
        voice = cfg.model.resolve_voice(request.voice or cfg.model.default_voice)
        if voice is None:
            raise UnknownVoice(f"unknown voice {shorten(request.voice)}; available voices: {', '.join(cfg.model.voices)} "
                               f"(or an alias: {', '.join(cfg.model.voice_aliases)})")
        return voice, SamplingParams.from_config(cfg.sampling, **request.sampling())

    def _prepare(self, text: str, voice: str | None, sampling: dict[str, Any]) -> tuple[list[list[int]], SamplingParams]:
        cfg = self.config
        request = parse(SynthesisRequest, {"text": text, "voice": voice, **sampling})
        voice, params = self._options(request)
        if not request.text.strip():
            raise InvalidRequest("text is empty: there is nothing to speak")
        limit = cfg.active_profile.max_text_chars
        if len(request.text) > limit:
            raise TextTooLong(
                f"text has {len(request.text)} characters; the '{cfg.profile}' profile accepts at most {limit}"
            )
        segments = split_text(request.text, MAX_SEGMENT_CHARS)
        try:
            prompts = [orpheus.build_prompt_ids(self.tokenizer, seg, voice) for seg in segments]
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
        longest = max(len(p) for p in prompts)
        if longest >= cfg.kv_cache.max_seq_len:
            raise InvalidRequest(f"a segment's prompt has {longest} tokens; kv_cache.max_seq_len is {cfg.kv_cache.max_seq_len}")
        return prompts, params

    async def on_engine_thread(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine thread between steps and return its result (for inspection)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def call() -> None:
            try:
                result = fn()
            except Exception as e:  # handed to the caller
                loop.call_soon_threadsafe(done.set_exception, e)
            else:
                loop.call_soon_threadsafe(done.set_result, result)

        self._loop.post(call)
        return await done

    # --- observability --------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The seed 004 ``/v1/stats`` snapshot (as published by the engine thread after its last step)."""
        if self.scheduler is None:
            return {}
        return self.scheduler.snapshot
