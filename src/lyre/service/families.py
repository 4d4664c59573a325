"""The parts of a running service that depend on the model family: its tokenizer, its
:class:`~lyre.family.base.Family`, its token engine and its codec (``runtime.start`` asks here and
builds the family-agnostic rest: scheduler, audio pipeline, engine thread).

Qwen3-TTS runs on the PyTorch engine (:class:`~lyre.engine.qwen3.engine.QwenEngine`) with the 12 Hz
codec (:class:`~lyre.codec.qwen12hz.runtime.TwelveHzCodec`, torch); it has no TensorRT-LLM path yet.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch

from lyre.codec.qwen12hz import Decoder, load_decoder
from lyre.codec.qwen12hz.load import read_config as read_decoder_config
from lyre.codec.qwen12hz.runtime import TwelveHzCodec
from lyre.config import LyreConfig
from lyre.engine.backend import BackendChoice
from lyre.engine.qwen3.engine import QwenEngine
from lyre.engine.qwen3.model import load_qwen3tts
from lyre.engine.torch.engine import TorchEngineConfig
from lyre.errors import LyreError
from lyre.family import ORPHEUS, Family
from lyre.family.qwen3tts import QwenFamily
from lyre.family.qwen3tts import demo as qwen_demo
from lyre.family.qwen3tts.family import family_config
from lyre.family.qwen3tts.tokenizer import load_text_tokenizer
from lyre.model import checkpoint
from lyre.model.qwen3tts import read_qwen3tts_config
from lyre.service.cloning import QwenCloning

log = logging.getLogger("lyre.service")


def load_family(cfg: LyreConfig, model: checkpoint.ResolvedModel, shared: Any) -> tuple[Family, Any, LyreConfig]:
    """The checkpoint's family, its text tokenizer, and ``cfg`` with the family's built-in voices."""
    if model.family == "qwen3-tts":
        family = QwenFamily(read_qwen3tts_config(model.llama_dir))
        tokenizer = shared.get(("qwen3-tts tokenizer", model.llama_dir), lambda: load_text_tokenizer(model.llama_dir))
        return family, tokenizer, family_config(cfg, family)
    tokenizer = shared.get(("tokenizer", model.llama_dir), lambda: checkpoint.load_tokenizer(model.llama_dir))
    return ORPHEUS, tokenizer, cfg


def family_backend(cfg: LyreConfig, family: Family, choice: BackendChoice) -> BackendChoice:
    """``choice`` as the family allows: Qwen3-TTS runs on the PyTorch engine only."""
    if family.name == "orpheus" or choice.name == "torch":
        return choice
    if cfg.model.backend == "trtllm":
        raise LyreError("model.backend is trtllm, but Qwen3-TTS has no TensorRT-LLM path yet (DESIGN.md says how it "
                        "would work): serve it with --set model.backend=torch (or auto)")
    return BackendChoice("torch", "auto: Qwen3-TTS runs on the PyTorch engine (no TensorRT-LLM path yet)")


def qwen_engine(cfg: LyreConfig, model: checkpoint.ResolvedModel, threads: int) -> tuple[QwenEngine, str, str]:
    """The Qwen3-TTS engine; ``threads``: torch's intra-op threads on CPU. ``dtype`` (and the KV's)
    auto is bfloat16 on a GPU, the checkpoints' own (float16 would risk the code predictor's NaN
    logits: it is kept in float32 under a float16 talker)."""
    engine_cfg = TorchEngineConfig.from_config(cfg)
    if engine_cfg.quantize != "none":
        raise LyreError(f"model.quantize {engine_cfg.quantize} is not available for Qwen3-TTS yet: set it to none")
    if engine_cfg.device == "cuda":
        engine_cfg = replace(engine_cfg, **{name: torch.bfloat16 for name, key in (("dtype", cfg.model.dtype),
                                                                                  ("kv_dtype", cfg.kv_cache.dtype))
                                            if key == "auto"})
    else:  # (process-wide: torch has one intra-op thread pool)
        torch.set_num_threads(threads)
    try:
        random = qwen_demo.random_marker(model.llama_dir)
        if random is None:
            engine = QwenEngine.from_checkpoint(model.llama_dir, engine_cfg)
        else:  # a shape checkpoint: its seeded random weights made on the engine's device
            device = torch.device(engine_cfg.device)
            weights = qwen_demo.random_weights(random["seed"], random["shape"], random["variant"], device,
                                               engine_cfg.dtype)
            talker = load_qwen3tts(read_qwen3tts_config(model.llama_dir), weights, engine_cfg.max_seq_len,
                                   engine_cfg.dtype, device)
            del weights
            engine = QwenEngine(talker, engine_cfg)
    except ValueError as e:
        raise LyreError(str(e)) from None
    return engine, engine_cfg.device, f"torch Qwen3-TTS on {engine_cfg.device} ({engine_cfg.dtype})"


def qwen_cloning(family: QwenFamily, tokenizer: Any, model: checkpoint.ResolvedModel, shared: Any
                 ) -> QwenCloning | None:
    """What a Base checkpoint enrolls voices with (its speaker encoder; the tokenizer's encoder at the
    first transcript); None for the other model types (they clone no voice)."""
    if family.cfg.model_type != "base":
        return None
    from safetensors import safe_open

    def load() -> QwenCloning:
        weights = {}
        for f in checkpoint.safetensors_files(model.llama_dir):  # (the speaker encoder's tensors only)
            with safe_open(str(f), framework="pt") as tensors:
                weights.update({k: tensors.get_tensor(k) for k in tensors.keys() if k.startswith("speaker_encoder.")})
        return QwenCloning(family, tokenizer, model.llama_dir, model.snac_dir, weights)

    return shared.get(("qwen cloning", model.llama_dir), load)


def qwen_codec(cfg: LyreConfig, model: checkpoint.ResolvedModel, device: str, shared: Any) -> TwelveHzCodec:
    """The 12 Hz codec on ``device`` (the decoder shared, loaded once per ``shared``), warmed up."""
    dtype = torch.float16 if (cfg.codec.fp16 and device == "cuda") else torch.float32
    decoder = shared.get(("12hz decoder", model.snac_dir, device, dtype),
                         lambda: _decoder(model.snac_dir, device, dtype).requires_grad_(False))
    codec = TwelveHzCodec(decoder)
    shared.get(("12hz warm", model.snac_dir, device, dtype), lambda: _warm_up(decoder))
    return codec


def _decoder(tokenizer_dir: Any, device: str, dtype: torch.dtype) -> Any:
    """The 12 Hz decoder of ``tokenizer_dir``: its weights, or a shape checkpoint's seeded random ones."""
    random = qwen_demo.random_marker(tokenizer_dir)
    if random is None:
        return load_decoder(tokenizer_dir, device, dtype)
    decoder = Decoder(read_decoder_config(tokenizer_dir)).to(device)
    decoder.load_state_dict(qwen_demo.random_decoder_weights(decoder, random["seed"]))
    return decoder.to(dtype=dtype).eval()


def _warm_up(decoder: Any) -> None:
    """The first caller does not pay the decoder's first runs."""
    with torch.inference_mode():
        decoder.decode(torch.zeros(1, decoder.cfg.num_quantizers, 2, dtype=torch.long,
                                   device=next(decoder.parameters()).device))
