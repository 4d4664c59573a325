"""The Qwen3-TTS talker and code predictor in plain PyTorch.

- :class:`Talker`: the Qwen3 decoder over the static slot KV cache (a :class:`Llama` whose
  vocabulary is the 3072 codec ids: ``codec_embedding`` in, ``codec_head`` out), read only through
  input rows (``ForwardBatch.embeds``), with the text embedding and its projection MLP beside it;
- :class:`CodePredictor`: the 5-layer decoder that samples codebooks 1-15 of a frame from the
  talker's last (normed) hidden state and codebook 0, over a frame-local K/V buffer
  (:class:`FrameKV`, allocated once for the largest batch) that every frame overwrites from
  position 0: all rows of a pass sit at the same position, so attention is dense, no mask but the
  causal one of the 2-row first pass.

Weight names are the reference checkpoint's (``talker.model.*``, ``talker.code_predictor.*``);
q/k/v and gate/up are fused at load time (:func:`load_qwen3tts`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lyre.engine.torch.llama import (
    DecoderLayer,
    Llama,
    QKProjection,
    layer_state,
    load_llama,
    rope_tables,
)
from lyre.engine.torch.transfer import upload
from lyre.model.checkpoint.llama import LlamaConfig
from lyre.model.layers import RMSNorm
from lyre.model.qwen3tts import CODE_GROUPS, Qwen3TTSConfig, TalkerPrompt
from lyre.model.qwen3tts.prompt import XVECTOR

PASSES = CODE_GROUPS - 1  # code predictor passes per frame


class Talker(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig, decoder: Llama):
        super().__init__()
        self.cfg = cfg
        self.decoder = decoder  # embed_tokens = codec_embedding, lm_head = codec_head
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)
        self.text_fc1 = nn.Linear(cfg.text_hidden_size, cfg.text_hidden_size)
        self.text_fc2 = nn.Linear(cfg.text_hidden_size, cfg.hidden_size)
        self.code_predictor = CodePredictor(cfg.code_predictor, cfg.hidden_size)

    def text_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """(n,) text ids -> (n, H): the projected text embeddings."""
        return self.text_fc2(F.silu(self.text_fc1(self.text_embedding(ids))))

    def prompt_rows(self, prompt: TalkerPrompt, device: torch.device) -> torch.Tensor:
        """(L, H): each prompt row's text track and codec track summed (a codec id's embedding, a
        frame's 16 codebook embeddings, or the prompt's x-vector)."""
        dtype = self.text_fc2.weight.dtype
        rows = torch.zeros(len(prompt.rows), self.cfg.hidden_size, dtype=dtype, device=device)

        def add(kind: type | str, track: int, embed) -> None:
            where = [i for i, row in enumerate(prompt.rows)
                     if (row[track] == kind if isinstance(kind, str) else isinstance(row[track], kind))]
            if where:
                rows[upload(where, device)] += embed([prompt.rows[i][track] for i in where])

        add(int, 0, lambda ids: self.text_rows(upload(ids, device)))
        add(int, 1, lambda ids: self.decoder.embed(upload(ids, device)))
        add(tuple, 1, lambda frames: self.frame_rows(upload(frames, device)))  # (n, 16) -> (n, H)
        if prompt.speaker is not None:
            add(XVECTOR, 1, lambda xs: torch.from_numpy(prompt.speaker).to(device, dtype).expand(len(xs), -1))
        return rows

    def frame_rows(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, 16) codes of a frame -> (B, H): codebook 0's codec embedding plus the code predictor's
        embeddings of codebooks 1-15 (the codec track of the next decode step), in the talker's dtype."""
        rows = self.decoder.embed(codes[:, 0]).float()
        for j, table in enumerate(self.code_predictor.embeddings):
            rows = rows + table(codes[:, j + 1]).float()
        return rows.to(self.text_fc2.weight.dtype)


class FrameKV:
    """The code predictor's K/V for one frame of up to ``batch`` rows: (layers, batch, kv_heads, 16,
    head_dim), allocated once; each frame writes positions 0-15 of its rows again."""

    def __init__(self, cfg: LlamaConfig, batch: int, dtype: torch.dtype, device: torch.device):
        shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, CODE_GROUPS, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def batch(self) -> int:
        return self.k.shape[1]


class FrameAttention(QKProjection):
    """Attention of a pass's rows (B, q) to their frame's positions so far, all rows at one position."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: FrameKV, layer: int, start: int
                ) -> torch.Tensor:
        b, q_len, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)  # (B, q, nh, hd), (B, q, nkv, hd) x2
        end = start + q_len
        kv.k[layer, :b, :, start:end] = k.transpose(1, 2).to(kv.k.dtype)
        kv.v[layer, :b, :, start:end] = v.transpose(1, 2).to(kv.v.dtype)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), kv.k[layer, :b, :, :end], kv.v[layer, :b, :, :end],
                                             is_causal=q_len > 1, enable_gqa=True)  # (B, nh, q, hd)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class CodePredictor(nn.Module):
    def __init__(self, cfg: LlamaConfig, talker_hidden: int):
        super().__init__()
        self.cfg = cfg
        self.projection = nn.Linear(talker_hidden, cfg.hidden_size) if talker_hidden != cfg.hidden_size else None
        self.embeddings = nn.ModuleList(nn.Embedding(cfg.vocab_size, talker_hidden) for _ in range(PASSES))
        self.layers = nn.ModuleList(DecoderLayer(cfg, FrameAttention(cfg)) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.heads = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(PASSES))
        cos, sin = rope_tables(cfg, CODE_GROUPS)
        self.register_buffer("rope_cos", cos, persistent=False)  # (16, hd)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype  # (float32 under a float16 talker)

    def forward(self, x: torch.Tensor, kv: FrameKV, start: int) -> torch.Tensor:
        """x (B, q, talker H) rows at positions start.. -> (B, Hcp): the last row's normed hidden state."""
        x = x.to(self.dtype)
        if self.projection is not None:
            x = self.projection(x)
        end = start + x.shape[1]
        cos = self.rope_cos[start:end][None, :, None]  # (1, q, 1, hd)
        sin = self.rope_sin[start:end][None, :, None]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv, i, start)
        return self.norm(x[:, -1])

    def logits(self, hidden: torch.Tensor, codebook: int) -> torch.Tensor:
        """(B, Hcp) -> (B, 2048) float32 logits of ``codebook`` (1-15)."""
        return self.heads[codebook - 1](hidden).float()


def load_qwen3tts(cfg: Qwen3TTSConfig, weights: dict[str, torch.Tensor], max_seq_len: int, dtype: torch.dtype,
                  device: torch.device) -> Talker:
    """The talker and its code predictor from reference-named ``weights``."""
    talker = {  # the decoder under the names load_llama reads
        "model.embed_tokens.weight": weights["talker.model.codec_embedding.weight"],
        "lm_head.weight": weights["talker.codec_head.weight"],
        "model.norm.weight": weights["talker.model.norm.weight"],
    }
    talker.update({name.removeprefix("talker."): w for name, w in weights.items()
                   if name.startswith("talker.model.layers.")})
    decoder = load_llama(cfg.talker, talker, max_seq_len, dtype, device)
    with torch.device("meta"):
        model = Talker(cfg, nn.Identity())
    model = model.to_empty(device=device).to(dtype)
    model.decoder = decoder  # (loaded: its state is copied onto itself below)
    cp = "talker.code_predictor."
    state = {
        "text_embedding.weight": weights["talker.model.text_embedding.weight"],
        "text_fc1.weight": weights["talker.text_projection.linear_fc1.weight"],
        "text_fc1.bias": weights["talker.text_projection.linear_fc1.bias"],
        "text_fc2.weight": weights["talker.text_projection.linear_fc2.weight"],
        "text_fc2.bias": weights["talker.text_projection.linear_fc2.bias"],
        "code_predictor.norm.weight": weights[cp + "model.norm.weight"],
    }
    for j in range(PASSES):
        state[f"code_predictor.embeddings.{j}.weight"] = weights[f"{cp}model.codec_embedding.{j}.weight"]
        state[f"code_predictor.heads.{j}.weight"] = weights[f"{cp}lm_head.{j}.weight"]
    if model.code_predictor.projection is not None:
        state["code_predictor.projection.weight"] = weights[cp + "small_to_mtp_projection.weight"]
        state["code_predictor.projection.bias"] = weights[cp + "small_to_mtp_projection.bias"]
    state.update(layer_state(weights, cfg.code_predictor, cp + "model.layers.", "code_predictor.layers."))
    state.update({f"decoder.{k}": v for k, v in decoder.state_dict().items()})
    model.load_state_dict(state, strict=True)
    if dtype == torch.float16:  # float16 gives the code predictor NaN logits (research §11.4): float32 it is
        model.code_predictor.float()
    cos, sin = rope_tables(cfg.code_predictor, CODE_GROUPS)  # float32; buffers do not survive to_empty
    model.code_predictor.rope_cos, model.code_predictor.rope_sin = cos.to(device), sin.to(device)
    return model.eval().requires_grad_(False)
