"""The PyTorch engine's settings, from the config's sections (``scheduler``, ``kv_cache``, ``model``,
``engine``, ``voices``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lyre.config import LyreConfig


@dataclass(frozen=True)
class TorchEngineConfig:
    slots: int = 32  # KV cache slots (scheduler.max_concurrent_sessions)
    max_batch_size: int = 16  # decoding requests per forward
    max_seq_len: int = 4096  # tokens per slot
    max_prefill_tokens: int = 512  # prompt tokens per forward
    device: str = "cpu"
    dtype: torch.dtype = torch.float32  # weights and activations
    kv_dtype: torch.dtype = torch.float32
    prefix_cache_bytes: int = 0  # kept prefixes' K/V (voices.prefix_cache_mb); 0 = none kept
    quantize: str = "none"  # int8: the decoder layers' linears with int8 weights (CPU; lyre.engine.torch.quantize)
    keep_freed_memory: bool = False  # CPU: glibc keeps freed step memory (lyre.engine.torch.host_heap)
    # audio rows decode over static shapes with their sampling on the device (lyre.engine.torch.audio_step);
    # None: on a GPU (a CPU runs the same code eagerly in the tests only: its own step is faster there)
    static_decode: bool | None = None
    cuda_graphs: bool = True  # on a GPU, that step is CUDA graphs captured at start (engine.cuda_graphs)

    @property
    def on_device_decode(self) -> bool:
        return self.device == "cuda" if self.static_decode is None else self.static_decode

    @classmethod
    def from_config(cls, cfg: LyreConfig) -> TorchEngineConfig:
        device = cfg.model.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        on_gpu = device == "cuda"

        def pick(name: str) -> torch.dtype:
            if name == "auto":
                return torch.float16 if on_gpu else torch.float32
            return getattr(torch, name)

        return cls(
            slots=cfg.scheduler.max_concurrent_sessions,
            max_batch_size=cfg.scheduler.max_batch_size,
            max_seq_len=cfg.kv_cache.max_seq_len,
            max_prefill_tokens=cfg.scheduler.max_prefill_tokens,
            device=device,
            dtype=pick(cfg.model.dtype),
            kv_dtype=pick(cfg.kv_cache.dtype),
            prefix_cache_bytes=cfg.voices.prefix_cache_mb * 2**20,
            quantize=cfg.model.quantize,
            keep_freed_memory=cfg.model.keep_freed_memory,
            cuda_graphs=cfg.engine.cuda_graphs,
        )
