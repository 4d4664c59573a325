"""The 12 Hz decoder's shape: the ``decoder_config`` of a checkpoint's ``speech_tokenizer/config.json``."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class DecoderConfig:
    codebook_size: int = 2048
    codebook_dim: int = 512
    num_quantizers: int = 16  # 1 semantic + 15 acoustic codebooks
    latent_dim: int = 1024
    hidden_size: int = 512  # the transformer's
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    sliding_window: int = 72  # a frame attends to itself and the 71 before it
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    attention_bias: bool = False
    upsampling_ratios: tuple[int, ...] = (2, 2)  # transposed convolutions + ConvNeXt blocks after the transformer
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)  # the decoder blocks' transposed convolutions
    decoder_dim: int = 1536

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DecoderConfig:
        """From config.json's ``decoder_config`` (keys it does not know are ignored; missing ones keep the
        defaults, which are the released checkpoint's)."""
        known = {f.name for f in fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known and v is not None}
        return cls(**values)

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsampling_ratios) * math.prod(self.upsample_rates)
