"""What a running service is made of, built from its config: the database, the checkpoint and
tokenizer, the token engine, the codec, and the engine thread that runs the scheduler over them.

:func:`start` builds it in order (blocking; the service runs it in a worker thread): a database that
cannot be opened stops the start at once, before any model is loaded; the engine and the codec share
the CPU by :func:`cpu_split`; the codec is warmed up before the first caller comes (and before a
TensorRT-LLM engine starts, whose executor sizes its KV cache from the GPU memory then free); a
start that fails after the engine was built closes it.

Several services in one process may share what does not change once loaded (:class:`Shared`: a
checkpoint's tokenizer, SNAC and its codec graphs, warmed up), each keyed by everything that shapes
it; each service still has its own engine, KV cache, codec streams and engine thread.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.engine import Engine as Database

from lyre.codec import (
    CodecError,
    CodecGraphs,
    StreamCodec,
    StreamSettings,
    WindowCodec,
    build_codec,
    configure_noise,
    load_graphs,
    resolve_runtime,
    warm_up,
)
from lyre.config import LyreConfig
from lyre.core.admission import AdmissionGate
from lyre.core.engine_loop import EngineLoop
from lyre.core.metrics import Metrics
from lyre.core.pipeline import AudioPipeline
from lyre.core.scheduler import Scheduler
from lyre.engine.backend import (
    BackendChoice,
    BackendError,
    Environment,
    Manifest,
    check_manifest,
    probe_environment,
    select_backend,
)
from lyre.engine.base import TokenEngine
from lyre.engine.torch.engine import TorchEngine, TorchEngineConfig
from lyre.engine.trtllm.config import TrtllmEngineConfig
from lyre.engine.trtllm.engine import TrtllmEngine
from lyre.errors import LyreError
from lyre.family import Family
from lyre.model import checkpoint, orpheus
from lyre.service import families
from lyre.service.cloning import OrpheusCloning
from lyre.service.gpu_memory import GpuMemory
from lyre.service.voices import Voices
from lyre.storage.db import database_url, open_database
from lyre.trust.audit import AuditTrail, instance_name

log = logging.getLogger("lyre.service")

SEGMENT_PROMPT_TOKENS = 160  # room a segment's own prompt needs beside a reference turn (~280 characters)


class Shared:
    """Loaded parts several services in one process may share (read-only once loaded), by key. A
    service given none loads its own."""

    def __init__(self) -> None:
        self._parts: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple, load: Callable[[], Any]) -> Any:
        """The part under ``key``, loaded by ``load()`` the first time (one load at a time)."""
        with self._lock:
            if key not in self._parts:
                self._parts[key] = load()
            return self._parts[key]


@dataclass
class Runtime:
    backend: BackendChoice
    database: Database
    audit: AuditTrail
    model: checkpoint.ResolvedModel
    tokenizer: Any
    scheduler: Scheduler
    loop: EngineLoop  # started: the engine thread runs
    family: Family
    config: LyreConfig  # the config as served: a Qwen3-TTS checkpoint's speakers are its built-in voices


@dataclass(frozen=True)
class CpuSplit:
    engine_threads: int  # torch's intra-op threads for the PyTorch engine on CPU
    codec_threads: int  # cores the CPU codec runtime may use (lyre.codec.runtime_threads splits them)
    overlap: bool  # the codec decodes on its own thread while the engine steps


def start(cfg: LyreConfig, gate: AdmissionGate, metrics: Metrics, voices: Voices, shared: Shared | None = None
          ) -> Runtime:
    """Build and start everything ``cfg`` asks for; ``voices`` is opened on the database and given
    what enrollment encodes with. Raises LyreError (or CheckpointError, DatabaseError) naming what
    cannot run."""
    shared = shared if shared is not None else Shared()
    choice, env = choose_backend(cfg)
    database = open_database(database_url(cfg.voices.database_url, cfg.data_dir))  # first: fails fast
    voices.open(database)
    audit = AuditTrail(database, cfg.audit, spool=Path(cfg.data_dir) / "audit-spool.jsonl",
                       instance=instance_name(cfg.data_dir))
    model = checkpoint.resolve_model(cfg.model, cfg.codec)
    family, tokenizer, cfg = families.load_family(cfg, model, shared)
    voices.config = cfg  # (the built-in voices as served)
    choice = families.family_backend(cfg, family, choice)
    settings = stream_settings(cfg)
    engine: TokenEngine | None = None
    try:
        if family.name == "qwen3-tts":
            engine, engine_device, description = families.qwen_engine(cfg, model, _engine_threads(cfg))
            split = cpu_split(cfg, _codec_device(cfg, engine_device), codec_runtime="torch")
            codec = families.qwen_codec(cfg, model, _codec_device(cfg, engine_device), shared)
            cloning = families.qwen_cloning(family, tokenizer, model, shared)
        elif choice.name == "trtllm":
            manifest = trtllm_manifest(cfg, env, model)  # a wrong engine is refused before anything loads
            # the codec first, loaded and warmed up: the executor sizes its KV cache from the GPU
            # memory free when it starts, and would leave the codec none
            memory = GpuMemory.now()
            codec_device = _codec_device(cfg, "cuda")
            split = cpu_split(cfg, codec_device)
            codec, snac = _codec(cfg, model, codec_device, split.codec_threads, settings, shared)
            cloning = OrpheusCloning(snac, tokenizer, model.snac_dir)
            memory.mark("the codec (loaded and warmed up)")
            engine, _, description = build_engine(cfg, choice, env, model, manifest)
            memory.mark(f"the TensorRT-LLM engine (weights, and a KV cache of at most "
                        f"{getattr(engine.cfg, 'kv_max_tokens', 0) or 'unbounded'} tokens)")
            memory.report()
        else:
            engine, engine_device, description = build_engine(cfg, choice, env, model)
            codec_device = _codec_device(cfg, engine_device)
            split = cpu_split(cfg, codec_device)
            codec, snac = _codec(cfg, model, codec_device, split.codec_threads, settings, shared)
            cloning = OrpheusCloning(snac, tokenizer, model.snac_dir)
        voices.attach(cloning, model.source, reference_room(cfg, choice))
        audio = AudioPipeline(codec, settings, cfg.codec.max_round_ms / 1000, metrics, split.overlap,
                              cfg.scheduler.first_chunk, family=family)
        scheduler = Scheduler(cfg.scheduler, engine, audio, gate, metrics=metrics, family=family)
        loop = EngineLoop(scheduler)
        loop.start()
    except BaseException:
        if engine is not None and hasattr(engine, "close"):
            engine.close()  # (a TensorRT-LLM executor left open can keep the process from exiting)
        raise
    log.info("engine: %s; %s; model %s%s", description, choice.reason, model.source,
             " — DEMO, audio is noise" if model.is_demo else "")
    return Runtime(choice, database, audit, model, tokenizer, scheduler, loop, family, cfg)


def _codec(cfg: LyreConfig, model: checkpoint.ResolvedModel, device: str, threads: int, settings: StreamSettings,
           shared: Shared) -> tuple[StreamCodec | WindowCodec, Any]:
    """The codec on ``device`` (and the SNAC it decodes with, which enrollment encodes with): SNAC and
    its graphs loaded and warmed up once per ``shared``, the codec's stream state its own."""
    c = cfg.codec
    dtype = torch.float16 if (c.fp16 and device == "cuda") else torch.float32
    key = ("codec", model.snac_dir, device, dtype, c.noise, c.noise_seed, c.mode, c.runtime, c.onnx_dir, threads)

    def load() -> tuple[Any, CodecGraphs]:
        snac = configure_noise(checkpoint.load_snac(model.snac_dir, device, dtype), c.noise, c.noise_seed)
        try:
            return snac, load_graphs(c, snac, device, threads)
        except CodecError as e:
            raise LyreError(str(e)) from None

    snac, graphs = shared.get(key, load)
    codec = build_codec(c, snac, device, dtype, threads, graphs)
    # the first caller does not pay the codec's first runs (once per graphs and chunk sizes)
    shared.get(("warm", key, settings), lambda: warm_up(codec, settings))
    return codec, snac


def _codec_device(cfg: LyreConfig, engine_device: str) -> str:
    return cfg.codec.device if cfg.codec.device != "auto" else engine_device


def choose_backend(cfg: LyreConfig) -> tuple[BackendChoice, Environment]:
    """``model.backend`` against what this machine has (probed only when TensorRT-LLM may serve)."""
    env = probe_environment() if cfg.model.backend != "torch" else Environment()
    try:
        return select_backend(cfg.model.backend, cfg.build.engine_dir, env), env
    except BackendError as e:
        raise LyreError(str(e)) from None


def build_engine(cfg: LyreConfig, choice: BackendChoice, env: Environment, model: checkpoint.ResolvedModel,
                 manifest: Manifest | None = None) -> tuple[TokenEngine, str, str]:
    """The token engine, the device it runs on, and how to say it in the log (``manifest``: the
    TensorRT-LLM engine's, when already checked)."""
    if choice.name == "trtllm":
        if cfg.model.quantize != "none":
            log.warning("model.quantize %s applies to the PyTorch backend; the TensorRT-LLM engine keeps the "
                        "quantization it was built with", cfg.model.quantize)
        return _trtllm_engine(cfg, env, model, manifest)
    engine_cfg = TorchEngineConfig.from_config(cfg)
    if engine_cfg.device == "cpu":  # (process-wide: torch has one intra-op thread pool)
        torch.set_num_threads(_engine_threads(cfg))
    try:
        engine = TorchEngine.from_checkpoint(model.llama_dir, engine_cfg)
    except ValueError as e:  # (a quantization this device cannot run)
        raise LyreError(str(e)) from None
    weights = "" if engine_cfg.quantize == "none" else f", {engine_cfg.quantize} decoder weights"
    return engine, engine_cfg.device, f"torch on {engine_cfg.device} ({engine_cfg.dtype}{weights})"


def trtllm_manifest(cfg: LyreConfig, env: Environment, model: checkpoint.ResolvedModel) -> Manifest:
    """build.engine_dir's manifest, checked against this machine and the checkpoint (LyreError if not)."""
    try:
        manifest = check_manifest(cfg.build.engine_dir, env)
    except BackendError as e:
        raise LyreError(str(e)) from None
    if model.is_demo and Path(manifest.model_source).resolve() != model.llama_dir.resolve():
        raise LyreError(
            f"the engine in {cfg.build.engine_dir} was built from {manifest.model_source}, but the tokenizer and "
            f"codec resolve to the demo checkpoint: set model.path to the checkpoint the engine was built from"
        )
    return manifest


def _trtllm_engine(cfg: LyreConfig, env: Environment, model: checkpoint.ResolvedModel,
                   manifest: Manifest | None = None) -> tuple[TokenEngine, str, str]:
    """The TensorRT-LLM engine of build.engine_dir, after checking its manifest against this machine
    (unless ``manifest`` is that, checked)."""
    manifest = manifest or trtllm_manifest(cfg, env, model)
    engine = TrtllmEngine(TrtllmEngineConfig.from_config(cfg, manifest))
    return engine, "cuda", (f"trtllm {manifest.quantization} engine {cfg.build.engine_dir} on {manifest.gpu_name} "
                            f"(TensorRT-LLM {manifest.tensorrt_llm_version}; not yet run on a GPU by this project)")


def reference_room(cfg: LyreConfig, choice: BackendChoice) -> int:
    """Tokens a cloned voice's reference turn may take: a slot's room for the prompt, less what a
    segment's own text needs (a longer reference is refused at enrollment)."""
    room = cfg.kv_cache.max_seq_len - cfg.sampling.max_tokens
    if choice.name == "trtllm":
        room = min(room, cfg.build.max_input_len)
    return room - SEGMENT_PROMPT_TOKENS


def _engine_threads(cfg: LyreConfig) -> int:
    return cfg.model.cpu_threads or max(1, (os.cpu_count() or 2) // 2)


def cpu_split(cfg: LyreConfig, codec_device: str, codec_runtime: str | None = None) -> CpuSplit:
    """How the engine and the codec share the CPU. With a CPU runtime of its own (onnxruntime,
    openvino) the codec decodes on its own thread while the engine steps (``codec.overlap: auto``):
    onnxruntime on every core (``codec.cpu_threads: 0``), openvino on the cores the engine leaves.
    ``codec_runtime``: the runtime the family's codec runs on, when it is not ``codec.runtime``'s
    choice (Qwen3-TTS's 12 Hz codec: torch)."""
    cores = os.cpu_count() or 2
    engine_threads = _engine_threads(cfg)
    c = cfg.codec
    own_runtime = _cpu_runtime(c.runtime, codec_device) if codec_runtime is None else codec_runtime != "torch"
    overlap = c.overlap == "on" or (c.overlap == "auto" and (codec_device == "cuda" or (
        c.mode == "stream" and cores >= 2 and own_runtime)))
    # onnxruntime splits a round across the cores (the engine thread waits on the GIL or for work
    # much of a step); openvino's one call per round keeps to the cores the engine leaves
    shared = not (overlap and _resolved(c.runtime, codec_device) == "openvino")
    codec_threads = c.cpu_threads or (cores if shared else max(1, cores - engine_threads))
    return CpuSplit(engine_threads, codec_threads, overlap)


def _cpu_runtime(runtime: str, device: str) -> bool:
    """Does a CPU runtime of its own (onnxruntime, openvino) run the streaming codec?"""
    return _resolved(runtime, device) not in ("torch", None)


def _resolved(runtime: str, device: str) -> str | None:
    try:
        return resolve_runtime(runtime, device)
    except CodecError:
        return None  # build_codec says why


def stream_settings(cfg: LyreConfig) -> StreamSettings:
    return StreamSettings(
        context_frames=cfg.codec.context_frames,
        first_flush_frames=cfg.scheduler.flush_first_n_tokens // orpheus.FRAME_TOKENS,
        every_flush_frames=cfg.scheduler.flush_every_n_tokens // orpheus.FRAME_TOKENS,
        max_chunk_frames=cfg.codec.max_chunk_frames,
        warmup_frames=cfg.codec.warmup_frames,
    )
