"""The Llama decoder in plain PyTorch, over a static slot KV cache.

Read top-down: ``Llama.forward`` embeds a flat batch of tokens from several sequences (prefill
chunks and single decode tokens mixed), runs the decoder layers, and returns the final hidden state
of the tokens that will be sampled; ``Llama.logits`` turns those into logits over the whole
vocabulary or over one 4096-id band of it (constrained audio decoding computes only those rows of
``lm_head``).

Every shape comes from the checkpoint's ``config.json`` (:class:`lyre.model.checkpoint.LlamaConfig`).
Weight names follow Hugging Face's; q/k/v and gate/up are fused at load time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from lyre.engine.torch.transfer import upload
from lyre.model.checkpoint import LlamaConfig
from lyre.model.layers import RMSNorm

# Attention runs on every SDPA backend but cuDNN's. cuDNN's attention (which torch picks first on
# Hopper) builds an execution plan for every new shape, and a decode step's K/V length is new
# every step: measured on an H200 (torch 2.11, the tiny demo at batch 8, cProfile), 10 ms per call
# for a length not seen before against 0.08 ms once seen, ~45 ms per step in all. The others plan nothing.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

# --------------------------------------------------------------------------------------------
# the model, top-down


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig, max_seq_len: int):
        super().__init__()
        self.cfg = cfg
        # lm_head is kept transposed, (hidden, vocab): a token's weights are a column. Logits over
        # the whole vocabulary are then hidden @ lm_head_t with the vocabulary contiguous, which
        # CPU BLAS computes 1.4-1.6x faster than against (vocab, hidden) rows at batch 4-32 (small
        # shape); a frame slot's band is a column slice. A tied checkpoint embeds from its columns.
        self.lm_head_t = nn.Parameter(torch.empty(cfg.hidden_size, cfg.vocab_size))
        self.embed_tokens = None if cfg.tie_word_embeddings else nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.full_logits: nn.Module | None = None  # lm_head over the whole vocabulary when quantized (quantize.py)
        cos, sin = rope_tables(cfg, max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_seq_len, head_dim)
        self.register_buffer("rope_sin", sin, persistent=False)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(T,) ids -> (T, H) embeddings."""
        if self.embed_tokens is not None:
            return self.embed_tokens(token_ids)
        return self.lm_head_t.index_select(1, token_ids).T.contiguous()  # (tied: lm_head's columns)

    def forward(self, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        """Hidden states of ``batch.sample_index`` tokens after the final norm: (N, hidden)."""
        x = self.embed(batch.token_ids) if batch.embeds is None else batch.embeds  # (T, H)
        cos = self.rope_cos[batch.positions].unsqueeze(1)  # (T, 1, hd)
        sin = self.rope_sin[batch.positions].unsqueeze(1)
        with sdpa_kernel(SDPA_BACKENDS):  # (not cuDNN's: see SDPA_BACKENDS)
            for i, layer in enumerate(self.layers):
                x = layer(x, cos, sin, batch, cache, i)
        return self.norm(x[batch.sample_index])  # (N, H)

    def logits(self, hidden: torch.Tensor, band_start: int | None = None, band_size: int = 0) -> torch.Tensor:
        """(N, H) -> (N, vocab) logits, or (N, band_size) for ids band_start..band_start+band_size-1."""
        if band_start is None and self.full_logits is not None:
            return self.full_logits(hidden).float()  # (N, vocab), int8 weights
        w = self.lm_head_t  # (H, V)
        if band_start is not None:
            w = w[:, band_start : band_start + band_size]  # a view: only these columns are computed
        return (hidden @ w).float()

    def logits_of(self, hidden: torch.Tensor, token_id: int) -> torch.Tensor:
        """(N, H) -> (N,) logit of one id."""
        return (hidden @ self.lm_head_t[:, token_id]).float()


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks; ``attention`` (default: the slot cache's :class:`Attention`)
    is called with the normed input and whatever the layer is called with after ``x``."""

    def __init__(self, cfg: LlamaConfig, attention: nn.Module | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = attention if attention is not None else Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, *attention_args) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), *attention_args)
        return x + self.mlp(self.post_attention_layernorm(x))


class QKProjection(nn.Module):
    """q, k and v of each token from one fused projection, q and k normed per head (Qwen3's
    ``qk_norm``) and rotated by position."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.n_heads + 2 * self.n_kv) * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (..., H) -> q (..., nh, hd), k and v (..., nkv, hd); cos/sin broadcast to (..., 1, hd)."""
        qkv = self.qkv_proj(x).view(*x.shape[:-1], self.n_heads + 2 * self.n_kv, self.head_dim)
        q, k, v = qkv.split([self.n_heads, self.n_kv, self.n_kv], dim=-2)
        if self.q_norm is None:
            q, k = apply_rope(qkv[..., : self.n_heads + self.n_kv, :], cos, sin).split([self.n_heads, self.n_kv], dim=-2)
        else:
            q, k = apply_rope(self.q_norm(q), cos, sin), apply_rope(self.k_norm(k), cos, sin)
        return q, k, v


class Attention(QKProjection):
    """Grouped-query attention; K/V go to the slot cache, queries attend to their slot's history."""

    def forward(self, x, cos, sin, batch: ForwardBatch, cache: KVCache, layer: int) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv(x, cos, sin)  # (T, nh, hd), (T, nkv, hd), (T, nkv, hd)
        cache.write(layer, batch.slots, batch.positions, k, v)
        out = torch.empty_like(q)  # (T, nh, hd)
        for g in batch.groups:
            b, q_max = g.q_index.shape
            group = self.n_heads // self.n_kv  # query heads per KV head (query head i reads KV head i // group)
            # the query heads of one KV head become extra query rows, so K/V are read as they lie
            # (SDPA's enable_gqa path with a mask repeats K/V: a copy of them per layer)
            qg = q[g.q_index].view(b, q_max, self.n_kv, group, self.head_dim)  # (B, Qmax, nkv, G, hd)
            qg = qg.permute(0, 2, 3, 1, 4).reshape(b, self.n_kv, group * q_max, self.head_dim)  # (B, nkv, G*Qmax, hd)
            kg, vg = cache.read(layer, g.slots, g.kv_len)  # (B, nkv, S, hd): views of the cache
            og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.grouped_mask(group))  # (B, nkv, G*Qmax, hd)
            og = og.view(b, self.n_kv, group, q_max, self.head_dim).permute(0, 3, 1, 2, 4)  # (B, Qmax, nkv, G, hd)
            rows = og.reshape(-1, self.n_heads, self.head_dim)  # (B*Qmax, nh, hd)
            out[g.token_index] = rows[g.valid_rows]  # (n, nh, hd)
        return self.o_proj(out.view(t, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (T, I) each
        return self.down_proj(F.silu(gate) * up)


# --------------------------------------------------------------------------------------------
# rotary position embedding


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies (head_dim/2,), with Llama 3's wavelength-dependent scaling when configured."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        return inv_freq
    factor = float(scaling["factor"])
    low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
    old_len = float(scaling.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (low frequencies) are slowed by `factor`, short ones kept, and the band
    # between them interpolated smoothly.
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    interpolated = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, interpolated, scaled)


def rope_tables(cfg: LlamaConfig, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for every position: (max_seq_len, head_dim) each, float32."""
    inv_freq = rope_inv_freq(cfg)
    freqs = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)  # (S, hd/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (S, hd)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, heads, hd) rotated by position; cos/sin (T, 1, hd)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


# --------------------------------------------------------------------------------------------
# KV cache and the layout of one forward


class KVCache:
    """K and V for ``slots`` sequences of up to ``max_seq_len`` tokens, allocated once.

    Layout (layers, slots, kv_heads, max_seq_len + 1, head_dim): the last position (:attr:`scratch`) is
    no sequence's: rows of a static step that do not run write there. Written only through :meth:`write`
    (a forward's new tokens) and :meth:`load` (a kept prefix, copied in on admission).
    """

    def __init__(self, cfg: LlamaConfig, slots: int, max_seq_len: int, dtype: torch.dtype, device: torch.device):
        shape = (cfg.num_hidden_layers, slots, cfg.num_key_value_heads, max_seq_len + 1, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.slots, self.max_seq_len = slots, max_seq_len
        self.scratch = max_seq_len  # the position no sequence reaches

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (T, kv_heads, hd) of tokens at (slots[i], positions[i])."""
        self.k[layer][slots, :, positions] = k.to(self.k.dtype)
        self.v[layer][slots, :, positions] = v.to(self.v.dtype)

    def load(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store a kept prefix's k, v (layers, kv_heads, n, hd) at positions 0..n-1 of ``slot``."""
        n = k.shape[2]
        self.k[:, slot, :, :n] = k
        self.v[:, slot, :, :n] = v

    def prefix(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the first ``length`` positions of ``slot`` in every layer: (layers, kv_heads, length, hd)."""
        return self.k[:, slot, :, :length], self.v[:, slot, :, :length]

    def read(self, layer: int, slots: tuple[int, int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``length`` positions of slots ``slots[0]`` to ``slots[1] - 1``: (B, kv_heads,
        length, hd) each, views of the cache (nothing is copied, whatever slots a batch holds:
        :func:`attention_groups` hands out consecutive ranges)."""
        a, b = slots
        return self.k[layer][a:b, :, :length], self.v[layer][a:b, :, :length]


MAX_GAP = 2  # slots between two sequences that one attention call bridges (their rows are computed and dropped)


@dataclass
class AttentionGroup:
    """Sequences attended together over one range of consecutive slots: B = the range's slots (a
    few may be gaps, slots not in this group), up to Qmax new tokens each, S cached positions."""

    slots: tuple[int, int]  # (first, last + 1)
    q_index: torch.Tensor  # (B, Qmax) flat token index of each query (padding and gaps repeat a valid one)
    valid_rows: torch.Tensor  # (n,) indices into the B*Qmax query rows of the real queries, row-major
    token_index: torch.Tensor  # (n,) flat token index of each of those queries
    mask: torch.Tensor  # (B, 1, Qmax, S) bool: key position <= query position within the slot
    kv_len: int  # S
    _grouped: tuple[int, torch.Tensor] | None = None

    def grouped_mask(self, group: int) -> torch.Tensor:
        """(B, 1, G*Qmax, S): ``mask`` for G query heads' rows per KV head (made once per forward)."""
        if self._grouped is None or self._grouped[0] != group:
            self._grouped = (group, self.mask.repeat(1, 1, group, 1))
        return self._grouped[1]


@dataclass
class ForwardBatch:
    token_ids: torch.Tensor  # (T,)
    positions: torch.Tensor  # (T,)
    slots: torch.Tensor  # (T,)
    groups: list[AttentionGroup]
    sample_index: torch.Tensor  # (N,) flat indices of the tokens whose next token is sampled
    embeds: torch.Tensor | None = None  # (T, H) the input rows themselves (a model that reads no ids)

    @classmethod
    def build(
        cls, seqs: list[tuple[int, int, list[int], bool]], device: torch.device
    ) -> ForwardBatch:
        """``seqs``: (slot, start position, new token ids, sample after the last one) per sequence.

        Single-token sequences (decode) and longer ones (prefill chunks) form separate attention
        groups so decode never pays for prefill padding. Everything is laid out on the host and
        uploaded without waiting for the device.
        """
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample: list[int] = []
        spans: list[tuple[int, int, int, int]] = []  # (slot, start, flat offset, length)
        for slot, start, ids, do_sample in seqs:
            offset = len(token_ids)
            token_ids += ids
            positions += range(start, start + len(ids))
            slots += [slot] * len(ids)
            spans.append((slot, start, offset, len(ids)))
            if do_sample:
                sample.append(offset + len(ids) - 1)
        groups = [
            group
            for decode in (True, False)
            for group in attention_groups([s for s in spans if (s[3] == 1) == decode], device)
        ]
        return cls(upload(token_ids, device), upload(positions, device), upload(slots, device), groups,
                   upload(sample, device))


def attention_groups(spans: list[tuple[int, int, int, int]], device: torch.device) -> list[AttentionGroup]:
    """Spans (slot, start, flat offset, length) in any order -> groups over consecutive slot ranges,
    so attention reads K/V in place: sorted by slot, cut where more than ``MAX_GAP`` slots lie
    between two spans."""
    runs: list[list[tuple[int, int, int, int]]] = []
    for span in sorted(spans):
        if runs and span[0] - runs[-1][-1][0] - 1 <= MAX_GAP:
            runs[-1].append(span)
        else:
            runs.append([span])
    return [_group(run, device) for run in runs]


def _group(run: list[tuple[int, int, int, int]], device: torch.device) -> AttentionGroup:
    """One attention call over slots run[0] .. run[-1] (ascending); a gap's row attends to its
    key 0 only (finite, never read back). Laid out in Python, the mask built on the device."""
    first, last = run[0][0], run[-1][0]
    rows = last - first + 1
    starts, lengths, offsets = [0] * rows, [0] * rows, [run[0][2]] * rows
    for slot, start, offset, n in run:
        starts[slot - first], lengths[slot - first], offsets[slot - first] = start, n, offset
    q_max = max(lengths)
    kv_len = max(a + n for a, n in zip(starts, lengths, strict=True))
    # query j of row b: token offsets[b] + j; padding (and a gap's row) repeats the row's last valid one
    q_index = [[off + max(0, min(j, n - 1)) for j in range(q_max)] for off, n in zip(offsets, lengths, strict=True)]
    valid_rows = [b * q_max + j for b, n in enumerate(lengths) for j in range(n)]
    token_index = [off + j for off, n in zip(offsets, lengths, strict=True) for j in range(n)]
    start_t, length_t = upload(starts, device), upload(lengths, device)
    q_pos = start_t[:, None] + torch.arange(q_max, device=device)[None, :]  # (B, Qmax)
    key_pos = torch.arange(kv_len, device=device)[None, None, :]  # (1, 1, S)
    mask = (key_pos <= q_pos[:, :, None]) & (key_pos < (start_t + length_t)[:, None, None])  # (B, Qmax, S)
    mask[:, :, 0] |= (length_t == 0)[:, None]  # gaps
    return AttentionGroup(
        slots=(first, last + 1),
        q_index=upload(q_index, device),
        valid_rows=upload(valid_rows, device),
        token_index=upload(token_index, device),
        mask=mask.unsqueeze(1),  # (B, 1, Qmax, S)
        kv_len=kv_len,
    )


# --------------------------------------------------------------------------------------------
# loading


def load_llama(
    cfg: LlamaConfig, weights: dict[str, torch.Tensor], max_seq_len: int, dtype: torch.dtype, device: torch.device
) -> Llama:
    """Build the model and copy Hugging Face-named ``weights`` in, fusing q/k/v and gate/up."""
    with torch.device("meta"):
        model = Llama(cfg, max_seq_len)
    model = model.to_empty(device=device).to(dtype)
    state = {"norm.weight": weights["model.norm.weight"]}
    if cfg.tie_word_embeddings:
        state["lm_head_t"] = weights["model.embed_tokens.weight"].T
    else:
        state["embed_tokens.weight"] = weights["model.embed_tokens.weight"]
        state["lm_head_t"] = weights["lm_head.weight"].T
    state.update(layer_state(weights, cfg, "model.layers.", "layers."))
    model.load_state_dict(state, strict=True)  # copies, casting to the model's dtype
    cos, sin = rope_tables(cfg, max_seq_len)  # float32 always; buffers do not survive to_empty
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return model.eval().requires_grad_(False)


def layer_state(weights: dict[str, torch.Tensor], cfg: LlamaConfig, source: str, target: str
                ) -> dict[str, torch.Tensor]:
    """The decoder layers' Hugging Face-named weights under ``source`` (``model.layers.``) as this
    module's state under ``target``: q/k/v and gate/up fused, Qwen3's q/k norms when configured."""
    state = {}
    for i in range(cfg.num_hidden_layers):
        p, q = f"{source}{i}.", f"{target}{i}."
        state[q + "input_layernorm.weight"] = weights[p + "input_layernorm.weight"]
        state[q + "post_attention_layernorm.weight"] = weights[p + "post_attention_layernorm.weight"]
        state[q + "self_attn.qkv_proj.weight"] = torch.cat([weights[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        state[q + "self_attn.o_proj.weight"] = weights[p + "self_attn.o_proj.weight"]
        if cfg.qk_norm:
            state[q + "self_attn.q_norm.weight"] = weights[p + "self_attn.q_norm.weight"]
            state[q + "self_attn.k_norm.weight"] = weights[p + "self_attn.k_norm.weight"]
        state[q + "mlp.gate_up_proj.weight"] = torch.cat([weights[p + "mlp.gate_proj.weight"],
                                                          weights[p + "mlp.up_proj.weight"]])
        state[q + "mlp.down_proj.weight"] = weights[p + "mlp.down_proj.weight"]
    return state
