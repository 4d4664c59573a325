"""The TensorRT-LLM engine's settings: limits from the engine's build (its manifest), runtime knobs
from Lyre's config."""

from __future__ import annotations

from dataclasses import dataclass

from lyre.config import LyreConfig
from lyre.engine.backend import Manifest
from lyre.model import orpheus


@dataclass(frozen=True)
class TrtllmEngineConfig:
    engine_dir: str
    max_batch_size: int = 32  # requests the engine runs at once (the build's max_batch_size)
    max_seq_len: int = 4096  # prompt + generated tokens per request (the build's max_seq_len)
    max_input_len: int = 3072
    max_num_tokens: int = 8192  # tokens per iteration across the batch
    vocab_size: int = orpheus.VOCAB_SIZE
    kv_bytes_per_token: int = 0  # 2 x layers x kv heads x head dim x 2 bytes; 0 = unknown
    free_gpu_memory_fraction: float = 0.9
    kv_max_tokens: int = 0  # KV cache tokens at most: every slot full (max_batch_size x max_seq_len); 0 = no cap
    enable_block_reuse: bool = True
    enable_chunked_context: bool = True
    pump_timeout_ms: int = 50  # await_responses timeout: how soon the pump notices close()
    step_wait_s: float = 0.005  # step() waits this long for a response while requests are in flight

    @classmethod
    def from_config(cls, cfg: LyreConfig, manifest: Manifest) -> TrtllmEngineConfig:
        """Limits come from what the engine was built with (its manifest), runtime knobs from the config."""
        b, m = manifest.build, manifest.build.get("model", {})
        layers, kv_heads, head_dim = m.get("num_hidden_layers"), m.get("num_key_value_heads"), m.get("head_dim")
        max_batch_size = int(b.get("max_batch_size", cfg.build.max_batch_size))
        max_seq_len = int(b.get("max_seq_len", cfg.build.max_seq_len))
        return cls(
            engine_dir=cfg.build.engine_dir,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            max_input_len=int(b.get("max_input_len", cfg.build.max_input_len)),
            max_num_tokens=int(b.get("max_num_tokens", cfg.build.max_num_tokens)),
            vocab_size=int(m.get("vocab_size", orpheus.VOCAB_SIZE)),
            kv_bytes_per_token=2 * layers * kv_heads * head_dim * 2 if layers and kv_heads and head_dim else 0,
            free_gpu_memory_fraction=cfg.kv_cache.free_gpu_memory_fraction,
            kv_max_tokens=max_batch_size * max_seq_len,
            enable_block_reuse=cfg.kv_cache.enable_block_reuse,
        )
