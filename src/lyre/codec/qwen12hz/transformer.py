"""The 12 Hz decoder's transformer: pre-norm layers (RMSNorm, rotary attention over a sliding window,
SwiGLU MLP, both scaled by a learnt per-channel factor) between two projections. Frame ``p``
attends to frames ``p - window + 1 .. p``; a stream keeps each layer's last ``window - 1`` keys and
values, which rows hold one (a stream younger than the window has fewer), and its next position.
Parameter names are the checkpoint's (``pre_transformer.*``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lyre.codec.qwen12hz.config import DecoderConfig
from lyre.codec.qwen12hz.layers import State, Streaming
from lyre.model.layers import RMSNorm


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, halves convention: x (B, H, T, D), cos/sin (B, 1, T, D)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Attention(Streaming):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.attention_head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.kept = cfg.sliding_window - 1  # past frames a new frame can still see

    def initial(self, batch: int, device: torch.device, dtype: torch.dtype) -> State:
        kv = torch.zeros(batch, self.kv_heads, self.kept, self.head_dim, device=device, dtype=dtype)
        return {f"{self.key}.k": kv, f"{self.key}.v": kv.clone(),
                f"{self.key}.valid": torch.zeros(batch, self.kept, dtype=torch.bool, device=device)}

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, state: State) -> torch.Tensor:
        b, t, _ = x.shape
        q = rotate(self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2), cos, sin)  # (B, H, T, D)
        k = rotate(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        past_k, past_v, past_valid = (state.get(f"{self.key}.{n}") for n in ("k", "v", "valid"))
        if past_k is None:
            past_k = k.new_zeros(b, self.kv_heads, self.kept, self.head_dim)
            past_v = torch.zeros_like(past_k)
            past_valid = torch.zeros(b, self.kept, dtype=torch.bool, device=x.device)
        keys, values = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)  # (B, H, kept + T, D)
        valid = torch.cat([past_valid, torch.ones(b, t, dtype=torch.bool, device=x.device)], dim=1)  # (B, kept + T)
        # query j (of this chunk) sees kept key s when s >= j (within the window) and new key i when j - kept <= i <= j
        j = torch.arange(t, device=x.device)[:, None]
        s = torch.arange(self.kept + t, device=x.device)[None, :]
        in_window = (s >= j) & (s <= j + self.kept)  # (T, kept + T): by position relative to the chunk
        mask = in_window[None] & valid[:, None, :]  # (B, T, kept + T)
        state[f"{self.key}.k"], state[f"{self.key}.v"] = keys[..., -self.kept:, :], values[..., -self.kept:, :]
        state[f"{self.key}.valid"] = valid[:, -self.kept:]
        if self.heads != self.kv_heads:  # (the released decoder has as many KV heads as query heads)
            repeat = self.heads // self.kv_heads
            keys, values = keys.repeat_interleave(repeat, 1), values.repeat_interleave(repeat, 1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None])  # (B, H, T, D)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class Mlp(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = Mlp(cfg)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size)

    def forward(self, x, cos, sin, state: State) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, state))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(Streaming):
    """(B, T, latent) -> (B, T, latent); positions continue the stream's."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        dim = cfg.attention_head_dim
        self.register_buffer("inv_freq", 1.0 / cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim),
                             persistent=False)

    def initial(self, batch: int, device: torch.device, dtype: torch.dtype) -> State:
        return {f"{self.key}.position": torch.zeros(batch, dtype=torch.long, device=device)}

    def forward(self, x: torch.Tensor, state: State) -> torch.Tensor:
        b, t, _ = x.shape
        start = state.get(f"{self.key}.position")
        if start is None:
            start = torch.zeros(b, dtype=torch.long, device=x.device)
        positions = start[:, None] + torch.arange(t, device=x.device)  # (B, T)
        state[f"{self.key}.position"] = start + t
        freqs = positions[..., None].float() * self.inv_freq  # (B, T, D/2)
        angles = torch.cat([freqs, freqs], dim=-1)[:, None]  # (B, 1, T, D)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, cos, sin, state)
        return self.output_proj(self.norm(h))
