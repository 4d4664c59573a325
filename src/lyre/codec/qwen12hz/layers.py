"""The 12 Hz decoder's convolutional layers, each able to continue a stream: a layer given a chunk
of frames and the state of its stream (a dict it keeps its entry in, under its ``key``) returns
exactly the part of the output those frames add, as a decode of everything so far would.

Shapes are (batch, channels, time) throughout. Every convolution here has stride 1 and pads on
the left only, so its state is its last ``dilation * (kernel - 1)`` inputs (zeros at the start: the
left padding). A transposed convolution whose kernel is twice its stride overlaps the next frame's
output by one stride, so its state is its last input frame; one whose kernel equals its stride has
none. Parameter names are the checkpoint's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

State = dict[str, torch.Tensor]


class Streaming(nn.Module):
    """A layer that keeps per-stream state under ``key`` (its name in the decoder; set by it)."""

    key = ""

    def initial(self, batch: int, device: torch.device, dtype: torch.dtype) -> State:
        """The state of ``batch`` streams before their first frame (what a decode from the start pads with)."""
        return {}


class CausalConv(Streaming):
    """Conv1d with ``dilation * (kernel - 1)`` zeros of left padding, stride 1. (B, Cin, T) -> (B, Cout, T)."""

    def __init__(self, channels_in: int, channels_out: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(channels_in, channels_out, kernel, dilation=dilation, groups=groups)
        self.history = dilation * (kernel - 1)

    def initial(self, batch: int, device: torch.device, dtype: torch.dtype) -> State:
        if self.history == 0:
            return {}
        return {self.key: torch.zeros(batch, self.conv.in_channels, self.history, device=device, dtype=dtype)}

    def forward(self, x: torch.Tensor, state: State) -> torch.Tensor:
        if self.history == 0:
            return self.conv(x)
        past = state.get(self.key)
        if past is None:
            past = x.new_zeros(x.shape[0], x.shape[1], self.history)
        window = torch.cat([past, x], dim=-1)  # (B, Cin, history + T)
        state[self.key] = window[..., -self.history:]
        return self.conv(window)


class CausalTransposedConv(Streaming):
    """ConvTranspose1d trimmed on the right to ``stride`` samples per input frame.
    (B, Cin, T) -> (B, Cout, T * stride)."""

    def __init__(self, channels_in: int, channels_out: int, kernel: int, stride: int):
        super().__init__()
        if kernel not in (stride, 2 * stride):
            raise ValueError(f"a transposed convolution of kernel {kernel} and stride {stride} is not one this decoder has")
        self.conv = nn.ConvTranspose1d(channels_in, channels_out, kernel, stride=stride)
        self.stride, self.overlap = stride, kernel > stride

    def initial(self, batch: int, device: torch.device, dtype: torch.dtype) -> State:
        if not self.overlap:
            return {}
        return {self.key: torch.zeros(batch, self.conv.in_channels, 1, device=device, dtype=dtype)}

    def forward(self, x: torch.Tensor, state: State) -> torch.Tensor:
        if not self.overlap:
            return self.conv(x)
        past = state.get(self.key)
        if past is None:  # (a zero frame adds nothing: the bias is added once per sample either way)
            past = x.new_zeros(x.shape[0], x.shape[1], 1)
        state[self.key] = x[..., -1:]
        y = self.conv(torch.cat([past, x], dim=-1))  # (B, Cout, (T + 2) * stride): the first stride is past's
        return y[..., self.stride: self.stride * (x.shape[-1] + 1)]


class SnakeBeta(nn.Module):
    """x + sin(x * e^alpha)^2 / (e^beta + 1e-9), per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.exp()[None, :, None]
        beta = self.beta.exp()[None, :, None]
        return x + torch.sin(x * alpha).pow(2) / (beta + 1e-9)


class ConvNeXtBlock(Streaming):
    """Causal depthwise conv (kernel 7), LayerNorm, pointwise MLP (x4, GELU), scaled, residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, state: State) -> torch.Tensor:
        h = self.dwconv(x, state).transpose(1, 2)  # (B, T, C)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(Streaming):
    """SnakeBeta, causal conv (kernel 7, dilated), SnakeBeta, conv (kernel 1), residual."""

    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor, state: State) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), state)), state)


class DecoderBlock(Streaming):
    """SnakeBeta, a transposed convolution (x ``rate`` samples), then residual units at dilations 1, 3, 9."""

    def __init__(self, dim_in: int, dim_out: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList([SnakeBeta(dim_in), CausalTransposedConv(dim_in, dim_out, 2 * rate, rate),
                                    *(ResidualUnit(dim_out, d) for d in (1, 3, 9))])

    def forward(self, x: torch.Tensor, state: State) -> torch.Tensor:
        for layer in self.block:
            x = layer(x, state) if isinstance(layer, Streaming) else layer(x)
        return x
