"""The Base checkpoints' speaker encoder: a clip's x-vector, the codec-track row that stands for a
cloned voice's speaker in the talker's prompt (research §4; the reference's
``Qwen3TTSSpeakerEncoder`` and ``extract_speaker_embedding``, M:311-393, M:1941-1954).

An ECAPA-TDNN over a 128-bin log-mel of the 24 kHz clip (n_fft 1024, hop 256, Hann window of
1024, 0-12 kHz, Slaney mel scale and area normalisation as librosa's ``filters.mel`` makes them,
magnitudes floored at 1e-5 before the log): a TDNN, three SE-Res2Net blocks, their outputs
aggregated, attentive statistics pooling, a 1x1 convolution to the talker's width. Module and
weight names are the reference's (``speaker_encoder.*`` in ``model.safetensors``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SAMPLE_RATE = 24000
N_FFT, HOP, MEL_BINS, FMAX = 1024, 256, 128, 12000


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """``speaker_encoder_config`` of a Base checkpoint's config.json (the reference's defaults)."""

    enc_dim: int = 1024  # the talker's hidden size: the x-vector is a codec-track row
    mel_dim: int = MEL_BINS
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = SAMPLE_RATE
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeakerEncoderConfig:
        names = {f for f in cls.__dataclass_fields__ if f != "extra"}
        given = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names}
        cfg = cls(**given, extra={k: v for k, v in d.items() if k not in names})
        n = len(cfg.enc_channels)
        if n < 3 or len(cfg.enc_kernel_sizes) != n or len(cfg.enc_dilations) != n:
            raise ValueError("speaker_encoder_config: enc_channels, enc_kernel_sizes and enc_dilations must have the "
                             "same length (at least 3)")
        if cfg.mel_dim != MEL_BINS or cfg.sample_rate != SAMPLE_RATE:
            raise ValueError(f"speaker_encoder_config: Lyre computes the reference's {MEL_BINS}-bin mel of "
                             f"{SAMPLE_RATE} Hz audio, not mel_dim {cfg.mel_dim} at {cfg.sample_rate} Hz")
        return cfg


def mel_filters(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = MEL_BINS, fmin: float = 0.0,
                fmax: float = FMAX) -> np.ndarray:
    """(n_mels, 1 + n_fft // 2) triangular filters on the Slaney mel scale, each normalised to
    unit area ("slaney"): the filterbank ``librosa.filters.mel`` makes with its defaults."""
    f_sp, min_log_hz, min_log_mel, logstep = 200.0 / 3, 1000.0, 15.0, np.log(6.4) / 27.0

    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        f = np.asarray(f, dtype=np.float64)
        return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, min_log_hz) / min_log_hz) / logstep,
                        f / f_sp)

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)

    fft_hz = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_hz = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    spacing = np.diff(mel_hz)
    ramps = mel_hz[:, None] - fft_hz[None, :]
    lower = -ramps[:-2] / spacing[:-1, None]
    upper = ramps[2:] / spacing[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper)) * (2.0 / (mel_hz[2:] - mel_hz[:-2]))[:, None]
    return weights.astype(np.float32)


def log_mel(pcm: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """(N,) float audio in [-1, 1] at 24 kHz -> (frames, 128) log-mel, as the reference computes it
    (reflect-padded by (n_fft - hop) / 2 each side, no centring)."""
    pad = (N_FFT - HOP) // 2
    y = F.pad(pcm[None, None], (pad, pad), mode="reflect")[0]  # (1, N + 2 pad)
    spec = torch.stft(y, N_FFT, hop_length=HOP, win_length=N_FFT, window=torch.hann_window(N_FFT, device=pcm.device),
                      center=False, normalized=False, onesided=True, return_complex=True)  # (1, 513, frames)
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(filters @ magnitude, min=1e-5))[0].T  # (frames, 128)


def _conv(cin: int, cout: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNN(nn.Module):
    """Convolution then ReLU (``TimeDelayNetBlock``)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = _conv(cin, cout, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    """The channels in ``scale`` groups; each group after the first through a TDNN, from the second
    on fed the previous group's output too."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(TDNN(channels // scale, channels // scale, kernel, dilation)
                                    for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(torch.chunk(x, self.scale, dim=1))
        out, previous = [parts[0]], None
        for block, part in zip(self.blocks, parts[1:], strict=True):
            previous = block(part if previous is None else part + previous)
            out.append(previous)
        return torch.cat(out, dim=1)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, se_channels: int):
        super().__init__()
        self.conv1 = _conv(channels, se_channels)
        self.conv2 = _conv(se_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))


class SERes2Net(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se_channels: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TDNN(cin, cout, 1, 1)
        self.res2net_block = Res2Net(cout, scale, kernel, dilation)
        self.tdnn2 = TDNN(cout, cout, 1, 1)
        self.se_block = SqueezeExcitation(cout, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


class AttentivePooling(nn.Module):
    """Per channel, a mean and a standard deviation weighted by attention over time (the attention
    sees each frame beside the clip's plain mean and deviation)."""

    EPS = 1e-12

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels)

    @classmethod
    def _stats(cls, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (w * x).sum(2)
        return mean, torch.sqrt((w * (x - mean[..., None]).pow(2)).sum(2).clamp(cls.EPS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T) -> (B, 2C, 1)
        t = x.shape[-1]
        mean, std = self._stats(x, torch.full_like(x[:, :1], 1.0 / t))
        context = torch.cat([x, mean[..., None].expand(-1, -1, t), std[..., None].expand(-1, -1, t)], dim=1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = self._stats(x, attention)
        return torch.cat([mean, std], dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: SpeakerEncoderConfig):
        super().__init__()
        self.cfg = cfg
        ch, k, d = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        self.blocks = nn.ModuleList([TDNN(cfg.mel_dim, ch[0], k[0], d[0])])
        self.blocks.extend(SERes2Net(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, k[i], d[i])
                           for i in range(1, len(ch) - 1))
        self.mfa = TDNN(ch[-1], ch[-1], k[-1], d[-1])
        self.asp = AttentivePooling(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, cfg.enc_dim)
        self.register_buffer("filters", torch.from_numpy(mel_filters()), persistent=False)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """(B, frames, 128) log-mels -> (B, enc_dim) x-vectors."""
        x, outs = mels.transpose(1, 2), []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x))[..., 0]

    @torch.inference_mode()
    def embed(self, pcm: np.ndarray) -> np.ndarray:
        """A 24 kHz float clip's x-vector, (enc_dim,) float32."""
        p = self.filters
        mels = log_mel(torch.from_numpy(np.ascontiguousarray(pcm, dtype=np.float32)).to(p.device), p)
        return self(mels[None].to(next(self.fc.parameters()).dtype))[0].float().cpu().numpy()


def load_speaker_encoder(cfg: SpeakerEncoderConfig, weights: dict[str, torch.Tensor],
                         device: torch.device | str = "cpu") -> SpeakerEncoder:
    """The encoder with ``weights``' ``speaker_encoder.*`` tensors (float32: it runs once per enrollment);
    ValueError naming a missing or misshapen tensor."""
    encoder = SpeakerEncoder(cfg)
    prefix = "speaker_encoder."
    own = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
    missing = sorted(set(encoder.state_dict()) - set(own))
    if missing:
        raise ValueError(f"the checkpoint has no speaker encoder weights {prefix}{missing[0]} (and {len(missing) - 1} "
                         "more): a Base checkpoint's model.safetensors carries them")
    try:
        encoder.load_state_dict({k: v.float() for k, v in own.items()}, strict=False)
    except RuntimeError as e:
        raise ValueError(f"the speaker encoder's weights do not fit speaker_encoder_config: {e}") from None
    return encoder.to(device).eval().requires_grad_(False)
