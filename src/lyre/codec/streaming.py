"""SNAC's decoder run incrementally and exactly: each Orpheus frame is decoded once.

SNAC 24 kHz's decoder (no attention in this configuration) is convolutions, transposed
convolutions and pointwise layers (Snake, 1x1 convolutions, noise, tanh) with symmetric padding,
so its output at a sample depends on a bounded window of its input. :class:`StreamingSnac` runs
the package's own modules and weights in that order, but each layer with context keeps, per
stream, the tail of its input that its next outputs still need (its *state*) and produces output
only as far as its right context allows. Feeding a stream's frames in any split gives the same
audio as one ``SNAC.decode`` of all of them; the exact output trails the newest frame by
:attr:`StreamingSnac.lag` samples (4757 for SNAC 24 kHz, ~2.3 frames).

Positions. Every call maps ``c`` new frames to ``c * 2048`` output samples: those at absolute
positions ``fed * 2048 - lag + [0, c * 2048)``, where ``fed`` is the number of frames the stream
had been given before. A fresh state is all zeros, and each layer zeroes the input samples that lie
before the start of the stream (or at or after ``end`` frames, once the stream is over) — exactly
the zero padding an offline decode applies at each layer's edges — so the first outputs (at
negative positions) are discarded by the caller and a stream is finished by a call with
:attr:`StreamingSnac.pad_frames` frames of padding and ``end`` set to its length. Finishing a
*copy* of a state gives what an offline decode of the frames so far would give: the provisional
audio of a stream's first chunks.

The call is a pure function of tensors (codes, positions, noise, states -> audio, states) so that
rows of several streams are stacked into one batch, and so that it exports to ONNX unchanged.
Layers are walked from the ``snac`` package's own ``Decoder``; weight norm is folded once (the same
weights, computed once instead of on every call); a transposed convolution with kernel ``2 * s``
and stride ``s`` runs as an equivalent two-tap convolution into ``s`` phases (its weights
rearranged), which is several times faster on CPU for short chunks. The decoder's noise is an
input (``x + noise * linear(x)``, ``NoiseBlock``'s definition with its own ``linear``), drawn by the
caller from a seedable generator, so a seeded stream is reproducible on every runtime.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as fn
from torch import nn

from lyre.model import orpheus

F = orpheus.SAMPLES_PER_FRAME
LATENT_PER_FRAME = 4  # SNAC 24 kHz: codebook 0 has 1 code per Orpheus frame, the finest 4 (vq_strides 4, 2, 1)


class StreamingUnsupported(ValueError):
    """The SNAC model has a layer that cannot run incrementally (e.g. attention)."""


def fold_weight_norm(module: nn.Module) -> nn.Module:
    """Replace weight-norm parametrisations by the weights they compute, in place (same values)."""
    from torch.nn.utils import parametrize

    for m in module.modules():
        if parametrize.is_parametrized(m):
            for name in list(m.parametrizations.keys()):
                parametrize.remove_parametrizations(m, name, leave_parametrized=True)
    return module


def _valid(x: torch.Tensor, fed: torch.Tensor, end: torch.Tensor, lag: int, per_frame: int) -> torch.Tensor:
    """``x`` (B, C, n) of new input samples with those outside the stream [0, end) zeroed. Sample j
    of row b sits at ``fed[b] * per_frame - lag + j``."""
    n = x.shape[-1]
    pos = (fed * per_frame - lag)[:, None] + torch.arange(n, device=x.device)[None, :]  # (B, n)
    keep = (pos >= 0) & (pos < (end * per_frame)[:, None])
    return x * keep[:, None, :].to(x.dtype)


class _Stage(nn.Module):
    """A layer with context. ``lag``/``per_frame`` describe its input: samples it trails the
    newest frame by, and samples per Orpheus frame."""

    stateful = True

    def __init__(self, lag: int, per_frame: int, channels: int, state_len: int):
        super().__init__()
        self.lag_in, self.per_frame_in = lag, per_frame
        self.state_shape = (channels, state_len)


class _Conv(_Stage):
    """Stride-1 convolution with symmetric padding ``p``: keeps the last ``2p`` input samples."""

    def __init__(self, conv: nn.Conv1d, lag: int, per_frame: int):
        k, d, p = conv.kernel_size[0], conv.dilation[0], conv.padding
        p = p[0] if isinstance(p, tuple) else None
        if conv.stride[0] != 1 or p is None or 2 * p != d * (k - 1):
            raise StreamingUnsupported(f"{conv} is not a stride-1 convolution with symmetric padding")
        super().__init__(lag, per_frame, conv.in_channels, 2 * p)
        self.conv = conv
        self.lag_out, self.per_frame_out = lag + p, per_frame

    def forward(self, x, state, fed, end):
        buf = torch.cat([state, _valid(x, fed, end, self.lag_in, self.per_frame_in)], dim=-1)  # (B, C, 2p + n)
        c = self.conv
        y = fn.conv1d(buf, c.weight, c.bias, 1, 0, c.dilation, c.groups)  # (B, C', n)
        return y, buf[..., buf.shape[-1] - self.state_shape[1] :]

    def whole(self, x):
        c = self.conv
        return fn.conv1d(x, c.weight, c.bias, 1, self.state_shape[1] // 2, c.dilation, c.groups)


class _Upsample(_Stage):
    """``ConvTranspose1d(kernel 2s, stride s, padding s/2)``: output block q (s samples) is
    ``w[..., :s] . x[q] + w[..., s:] . x[q-1]`` — a two-tap convolution into ``C' * s`` channels,
    interleaved. Keeps the last input sample."""

    def __init__(self, conv: nn.ConvTranspose1d, lag: int, per_frame: int):
        s, k = conv.stride[0], conv.kernel_size[0]
        if not (k == 2 * s and s % 2 == 0 and conv.padding[0] == s // 2 and conv.output_padding[0] == 0
                and conv.groups == 1 and conv.dilation[0] == 1):
            raise StreamingUnsupported(f"{conv} is not a transposed convolution this decoder can stream")
        super().__init__(lag, per_frame, conv.in_channels, 1)
        w = conv.weight.detach()  # (C_in, C_out, 2s)
        c_in, c_out = w.shape[:2]
        taps = torch.stack([w[:, :, s:], w[:, :, :s]], dim=-1)  # (C_in, C_out, s, 2): taps on x[q-1], x[q]
        self.register_buffer("weight", taps.permute(1, 2, 0, 3).reshape(c_out * s, c_in, 2).contiguous())
        self.register_buffer("bias", None if conv.bias is None else conv.bias.detach().repeat_interleave(s))
        self.stride, self.c_out = s, c_out
        self.lag_out, self.per_frame_out = lag * s + s // 2, per_frame * s

    def forward(self, x, state, fed, end):
        buf = torch.cat([state, _valid(x, fed, end, self.lag_in, self.per_frame_in)], dim=-1)  # (B, C, n + 1)
        return self._blocks(buf), buf[..., -1:]  # (B, C', n * s)

    def _blocks(self, buf):
        """Full transposed-convolution output blocks for the taps in ``buf`` (B, C, n + 1) -> (B, C', n * s)."""
        z = fn.conv1d(buf, self.weight, self.bias)  # (B, C' * s, n)
        b, _, n = z.shape
        return z.view(b, self.c_out, self.stride, n).transpose(2, 3).reshape(b, self.c_out, n * self.stride)

    def whole(self, x):
        n, h = x.shape[-1], self.stride // 2
        return self._blocks(fn.pad(x, (1, 1)))[..., h : h + n * self.stride]  # the crop of padding s/2


class _Residual(_Stage):
    """SNAC's ``ResidualUnit``: ``x + conv1x1(snake(conv(snake(x))))``, the middle convolution with
    padding ``p``. Keeps ``2p`` samples of ``snake(x)`` and ``p`` of ``x`` (the skip path's delay)."""

    def __init__(self, unit: nn.Module, lag: int, per_frame: int):
        snake1, conv, snake2, conv1x1 = unit.block
        inner = _Conv(conv, lag, per_frame)
        ctx = inner.state_shape[1]
        super().__init__(lag, per_frame, conv.in_channels, ctx + ctx // 2)
        self.inner, self.ctx = inner, ctx
        self.snake1, self.snake2, self.conv1x1 = snake1, snake2, conv1x1
        self.lag_out, self.per_frame_out = self.inner.lag_out, per_frame

    def forward(self, x, state, fed, end):
        x = _valid(x, fed, end, self.lag_in, self.per_frame_in)
        act, skip = state[..., : self.ctx], state[..., self.ctx :]
        buf = torch.cat([act, self.snake1(x)], dim=-1)  # (B, C, 2p + n)
        c = self.inner.conv
        y = self.conv1x1(self.snake2(fn.conv1d(buf, c.weight, c.bias, 1, 0, c.dilation, c.groups)))  # (B, C, n)
        xs = torch.cat([skip, x], dim=-1)  # (B, C, p + n)
        out = xs[..., : x.shape[-1]] + y
        tail = torch.cat([buf[..., buf.shape[-1] - self.ctx :], xs[..., xs.shape[-1] - self.ctx // 2 :]], dim=-1)
        return out, tail

    def whole(self, x):
        return x + self.conv1x1(self.snake2(self.inner.whole(self.snake1(x))))


class _Noise(nn.Module):
    """``NoiseBlock``: ``x + noise * linear(x)`` with ``noise`` (B, 1, n) given by the caller."""

    stateful = False

    def __init__(self, block: nn.Module, per_frame: int):
        super().__init__()
        self.linear, self.per_frame = block.linear, per_frame

    def forward(self, x, noise):
        return x + noise * self.linear(x)


class StreamingSnac(nn.Module):
    """``forward(c0, c1, c2, fed, end, noise, states) -> (audio, states)``:

    - ``c0`` (B, c), ``c1`` (B, 2c), ``c2`` (B, 4c): codes of ``c`` new frames per row;
    - ``fed`` (B,) int64: frames each row's stream was given before; ``end`` (B,) int64: the stream's
      length in frames once it is over (frames from there on are padding), else :data:`OPEN`;
    - ``noise``: one (B, 1, c * per_frame) tensor per noise layer (:attr:`noise_per_frame`), or ();
    - ``states``: one (B, C, K) tensor per layer with context (:attr:`state_shapes`);
    - ``audio`` (B, c * 2048): samples at ``fed * 2048 - lag + [0, c * 2048)``.

    Folds ``snac``'s weight norm in place (the same weights, computed once).
    """

    OPEN = 1 << 19  # ``end`` of a stream that is still going (frames; x 2048 still fits in int32)

    def __init__(self, snac: nn.Module):
        super().__init__()
        from snac.layers import DecoderBlock, NoiseBlock, ResidualUnit

        from lyre.codec.noise import SeededNoise

        if getattr(snac, "vq_strides", None) != [4, 2, 1] or getattr(snac, "attn_window_size", 0) is not None:
            raise StreamingUnsupported(
                "the streaming decoder needs SNAC 24 kHz's layout (vq_strides [4, 2, 1], no attention); "
                "use codec.mode: window for this codec"
            )
        fold_weight_norm(snac)
        self.quantizer = snac.quantizer
        layers: list[nn.Module] = []
        lag, per_frame = 0, LATENT_PER_FRAME

        def add(stage: nn.Module) -> None:
            nonlocal lag, per_frame
            layers.append(stage)
            if isinstance(stage, _Stage):
                lag, per_frame = stage.lag_out, stage.per_frame_out

        def walk(modules) -> None:
            for m in modules:
                if isinstance(m, DecoderBlock):
                    walk(m.block)
                elif isinstance(m, ResidualUnit):
                    add(_Residual(m, lag, per_frame))
                elif isinstance(m, nn.ConvTranspose1d):
                    add(_Upsample(m, lag, per_frame))
                elif isinstance(m, nn.Conv1d) and m.kernel_size[0] > 1:
                    add(_Conv(m, lag, per_frame))
                elif isinstance(m, (NoiseBlock, SeededNoise)):
                    add(_Noise(m, per_frame))
                elif isinstance(m, (nn.Conv1d, nn.Identity, nn.Tanh)) or type(m).__name__ == "Snake1d":
                    add(m)  # pointwise: applied to new samples as they come
                else:
                    raise StreamingUnsupported(f"SNAC layer {type(m).__name__} cannot run incrementally")

        walk(snac.decoder.model)
        if per_frame != F:
            raise StreamingUnsupported(f"the decoder makes {per_frame} samples per frame, not {F}")
        self.layers = nn.ModuleList(layers)
        self.lag = lag  # output samples the exact audio trails the newest frame by
        self.pad_frames = math.ceil(lag / F)  # frames of padding that flush a finished stream
        self.state_shapes = [m.state_shape for m in layers if isinstance(m, _Stage)]
        self.noise_per_frame = [m.per_frame for m in layers if isinstance(m, _Noise)]

    @property
    def state_bytes(self) -> int:
        """Memory of one stream's state in float32."""
        return 4 * sum(c * k for c, k in self.state_shapes)

    def new_state(self, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> list[torch.Tensor]:
        return [torch.zeros(1, c, k, dtype=dtype, device=device) for c, k in self.state_shapes]

    def forward(self, c0, c1, c2, fed, end, noise, states):
        x = self.quantizer.from_codes([c0, c1, c2])  # (B, latent, 4c)
        new_states, s, k = [], iter(states), iter(noise)
        for layer in self.layers:
            if isinstance(layer, _Stage):
                x, state = layer(x, next(s), fed, end)
                new_states.append(state)
            elif isinstance(layer, _Noise):
                x = layer(x, next(k))
            else:
                x = layer(x)
        return x[:, 0], new_states  # (B, c * 2048)


class OfflineSnac(nn.Module):
    """``forward(c0, c1, c2, noise) -> audio (B, T * 2048)``: one decode of whole frames through the
    same layers and weights as :class:`StreamingSnac` (SNAC.decode, with its transposed convolutions
    as two-tap convolutions) — what a stream of these frames gives once finished, at the cost of T
    frames where finishing a fresh stream would cost T + pad_frames. Stream mode's warm-up chunks."""

    def __init__(self, streaming: StreamingSnac):
        super().__init__()
        self.streaming = streaming

    def forward(self, c0, c1, c2, noise):
        x = self.streaming.quantizer.from_codes([c0, c1, c2])  # (B, latent, 4T)
        k = iter(noise)
        for layer in self.streaming.layers:
            if isinstance(layer, _Stage):
                x = layer.whole(x)
            elif isinstance(layer, _Noise):
                x = layer(x, next(k))
            else:
                x = layer(x)
        return x[:, 0]
