"""The 12 Hz decoder: codes (B, 16, T) -> 24 kHz audio (B, 1, T * 1920), decoded whole or as it streams.

    codes ─ split RVQ (1 semantic + 15 acoustic codebooks, summed, projected) ─ causal conv (k 3)
          ─ transformer (sliding window) ─ 2 x [transposed conv x2, ConvNeXt]
          ─ causal conv (k 7) ─ 4 x decoder block (x8, x5, x4, x3) ─ SnakeBeta ─ causal conv (k 7) ─ clamp

:meth:`Decoder.stream` continues a :class:`StreamState` by a chunk of frames and returns exactly the
audio those frames add; :meth:`Decoder.decode` is one chunk on a fresh state, the full causal decode.
Module and parameter names are the checkpoint's (``speech_tokenizer/model.safetensors``, under
``decoder.``), so its weights load as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from lyre.codec.qwen12hz.config import DecoderConfig
from lyre.codec.qwen12hz.layers import (
    CausalConv,
    CausalTransposedConv,
    ConvNeXtBlock,
    DecoderBlock,
    SnakeBeta,
    State,
    Streaming,
)
from lyre.codec.qwen12hz.transformer import Transformer

CODEBOOK_EPSILON = 1e-5  # a codebook entry is its summed embeddings over its use, the use at least this


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))
        self.cluster_usage = nn.Parameter(torch.ones(size))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, T) codes -> (B, dim, T)."""
        table = self.embedding_sum / self.cluster_usage.clamp(min=CODEBOOK_EPSILON)[:, None]
        return F.embedding(codes, table).transpose(1, 2)


class _Quantization(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _Layers(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(_Quantization(size, dim) for _ in range(n))


class ResidualQuantizer(nn.Module):
    """``n`` codebooks summed, then a 1x1 projection to the output width (``input_proj`` is the
    encoder's: kept so that the checkpoint loads whole, unused here)."""

    def __init__(self, n: int, size: int, dim: int, width: int):
        super().__init__()
        self.vq = _Layers(n, size, dim)
        self.input_proj = nn.Conv1d(width, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, width, 1, bias=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, n, T) -> (B, width, T)."""
        summed = None
        for i, layer in enumerate(self.vq.layers):
            part = layer._codebook(codes[:, i])
            summed = part if summed is None else summed + part
        return self.output_proj(summed)


class SplitQuantizer(nn.Module):
    """The semantic codebook and the 15 acoustic ones, each group projected, then added."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = ResidualQuantizer(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = ResidualQuantizer(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first(codes[:, :1]) + self.rvq_rest(codes[:, 1:])  # (B, codebook_dim, T)


POSITION = "pre_transformer.position"  # the state entry that counts each row's frames


@dataclass
class StreamState:
    """Where a batch of streams is: each streaming layer's carried inputs and the transformer's K/V
    and positions, one row per stream. Rows may be at different frames: streams are decoded
    together by stacking their states (:meth:`stack`) and go on alone after :meth:`split`."""

    tensors: State = field(default_factory=dict)

    @property
    def frames(self) -> list[int]:
        """Frames decoded so far, per row."""
        position = self.tensors.get(POSITION)
        return [] if position is None else position.tolist()

    @staticmethod
    def stack(states: list[StreamState]) -> StreamState:
        """One state of every row of ``states``, in order (each made by :meth:`Decoder.new_state` or
        carried on from one)."""
        keys = set(states[0].tensors)
        if any(set(s.tensors) != keys for s in states) or POSITION not in keys:
            raise ValueError("only states made by Decoder.new_state (or carried on from one) stack")
        return StreamState({k: torch.cat([s.tensors[k] for s in states]) for k in keys})

    def split(self) -> list[StreamState]:
        """One state per row (views of this one's tensors)."""
        rows = len(self.frames)
        return [StreamState({k: v[i:i + 1] for k, v in self.tensors.items()}) for i in range(rows)]


class Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.quantizer = SplitQuantizer(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = Transformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransposedConv(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios)
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList([
            CausalConv(cfg.latent_dim, cfg.decoder_dim, 7),
            *(DecoderBlock(dims[i], dims[i + 1], rate) for i, rate in enumerate(cfg.upsample_rates)),
            SnakeBeta(dims[-1]),
            CausalConv(dims[-1], 1, 7),
        ])
        for name, module in self.named_modules():  # each streaming layer keeps its state under its name
            if isinstance(module, Streaming):
                module.key = name

    def new_state(self, batch: int = 1) -> StreamState:
        """The state of ``batch`` streams before their first frame, on this decoder's device and dtype."""
        p = next(self.parameters())
        state = StreamState()
        for module in self.modules():
            if isinstance(module, Streaming):
                state.tensors.update(module.initial(batch, p.device, p.dtype))
        return state

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """The full causal decode: (B, 16, T) codes -> (B, 1, T * samples_per_frame) in [-1, 1]."""
        return self.stream(codes, self.new_state(codes.shape[0]))

    def stream(self, codes: torch.Tensor, state: StreamState) -> torch.Tensor:
        """The audio ``codes`` (B, 16, T) add to the streams ``state`` holds (updated in place)."""
        if codes.ndim != 3 or codes.shape[1] != self.cfg.num_quantizers:
            raise ValueError(f"codes must be (batch, {self.cfg.num_quantizers}, frames), not {tuple(codes.shape)}")
        s = state.tensors
        if POSITION in s and s[POSITION].shape[0] != codes.shape[0]:
            raise ValueError(f"{codes.shape[0]} rows of codes for a state of {s[POSITION].shape[0]} streams")
        h = self.pre_conv(self.quantizer(codes), s)  # (B, latent, T)
        h = self.pre_transformer(h.transpose(1, 2), s).transpose(1, 2)  # (B, latent, T)
        for transposed, convnext in self.upsample:
            h = convnext(transposed(h, s), s)  # (B, latent, T * 2, then * 4)
        for layer in self.decoder:
            h = layer(h, s) if isinstance(layer, Streaming) else layer(h)
        return h.clamp(-1.0, 1.0)  # (B, 1, T * samples_per_frame)
