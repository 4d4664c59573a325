"""A Lyre (Hugging Face Llama) checkpoint written as GGUF, the file llama.cpp serves: what an Orpheus
user on a CPU runs (``benchmark.py --baseline llamacpp``).

Written with the ``gguf`` package (llama.cpp's own writer) the way llama.cpp's converter writes a
Llama: q and k projection rows reordered from Hugging Face's rotate-half layout to GGML's
interleaved pairs, Llama 3's RoPE scaling as a ``rope_freqs`` tensor of per-frequency divisors, a
tied ``lm_head`` left out (llama.cpp reuses ``token_embd``), the byte-level BPE vocabulary with its
merges and its special tokens marked as control tokens. Types: ``f32``, ``f16`` (2-D weights only;
norms stay f32, as the converter does) and ``q8_0`` (every 2-D weight in 32-value blocks with one
f16 scale: ``convert_hf_to_gguf.py --outtype q8_0``).

:func:`export_cached` keeps the files under a cache directory (the benchmark's is
``<data_dir>/peer/``), named by the checkpoint's files (path, size, mtime), so a re-run reuses them
and a changed checkpoint is exported again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from lyre.engine.torch.llama import rope_inv_freq
from lyre.model.checkpoint import LlamaConfig, load_llama_weights, read_llama_config, safetensors_files

TYPES = ("f32", "f16", "q8_0")
# the token-id types of GGUF's vocabulary (gguf.TokenType): normal text pieces and control tokens
_NORMAL, _CONTROL = 1, 3


def _pairs_interleaved(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q or k projection (heads*hd, in), each head's halves [x0..x_{h/2}, y0..] reordered
    to pairs [x0, y0, x1, y1, ...]: GGML's RoPE rotates neighbouring values, Hugging Face's rotates
    the two halves of a head."""
    out = w.shape[0]
    return w.reshape(heads, 2, out // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rope_divisors(cfg: LlamaConfig) -> np.ndarray | None:
    """``rope_freqs.weight``: per frequency, how much Llama 3's scaling slows it (1 = kept); None
    without llama3 scaling. llama.cpp divides each base frequency by these."""
    scaling = cfg.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        return None
    dim = cfg.head_dim
    base = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    return (base / rope_inv_freq(cfg)).numpy().astype(np.float32)


def _vocabulary(model_dir: Path, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """Token strings, token types and merges from ``tokenizer.json`` (byte-level BPE), padded to
    the model's vocabulary size with control placeholders where the tokenizer has fewer ids."""
    data = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    model = data["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{model_dir}/tokenizer.json: a {model.get('type')} tokenizer; the GGUF export writes "
                         "byte-level BPE (Llama 3's)")
    tokens: list[str | None] = [None] * vocab_size
    types = [_NORMAL] * vocab_size
    for text, i in model["vocab"].items():
        if i < vocab_size:
            tokens[i] = text
    for added in data.get("added_tokens", []):
        i = added["id"]
        if i < vocab_size:
            tokens[i] = added["content"]
            types[i] = _CONTROL if added.get("special", True) else _NORMAL
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i], types[i] = f"[PAD{i}]", _CONTROL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return [t for t in tokens if t is not None], types, merges


def export(model_dir: str | Path, out: str | Path, kind: str = "f32") -> Path:
    """Write ``model_dir``'s Llama as a GGUF file of ``kind`` (f32, f16, q8_0) at ``out``."""
    import gguf

    if kind not in TYPES:
        raise ValueError(f"GGUF type {kind!r}: choose one of {', '.join(TYPES)}")
    model_dir, out = Path(model_dir), Path(out)
    cfg = read_llama_config(model_dir)
    weights = load_llama_weights(model_dir, cfg, dtype=torch.float32)
    quant = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "q8_0": gguf.GGMLQuantizationType.Q8_0}[kind]
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[kind]

    w = gguf.GGUFWriter(str(out) + ".partial", "llama")
    w.add_name(model_dir.name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(file_type)
    tokens, types, merges = _vocabulary(model_dir, cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    generation = json.loads((model_dir / "config.json").read_text())
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("pad_token_id", w.add_pad_token_id)):
        if isinstance(generation.get(key), int):
            add(generation[key])
    w.add_add_bos_token(False)  # Lyre's prompts carry their own BOS

    def put(name: str, t: torch.Tensor) -> None:
        a = t.numpy().astype(np.float32)
        if a.ndim == 1 or quant == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, a)
        elif quant == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, quant), raw_dtype=quant)

    divisors = rope_divisors(cfg)
    if divisors is not None:
        w.add_tensor("rope_freqs.weight", divisors)
    put("token_embd.weight", weights["model.embed_tokens.weight"])
    put("output_norm.weight", weights["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        put("output.weight", weights["lm_head.weight"])
    for i in range(cfg.num_hidden_layers):
        hf, g = f"model.layers.{i}.", f"blk.{i}."
        put(g + "attn_norm.weight", weights[hf + "input_layernorm.weight"])
        q = _pairs_interleaved(weights[hf + "self_attn.q_proj.weight"].numpy(), cfg.num_attention_heads)
        k = _pairs_interleaved(weights[hf + "self_attn.k_proj.weight"].numpy(), cfg.num_key_value_heads)
        put(g + "attn_q.weight", torch.from_numpy(q))
        put(g + "attn_k.weight", torch.from_numpy(k))
        put(g + "attn_v.weight", weights[hf + "self_attn.v_proj.weight"])
        put(g + "attn_output.weight", weights[hf + "self_attn.o_proj.weight"])
        put(g + "ffn_norm.weight", weights[hf + "post_attention_layernorm.weight"])
        put(g + "ffn_gate.weight", weights[hf + "mlp.gate_proj.weight"])
        put(g + "ffn_up.weight", weights[hf + "mlp.up_proj.weight"])
        put(g + "ffn_down.weight", weights[hf + "mlp.down_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(out) + ".partial", out)
    return out


def export_cached(model_dir: str | Path, kind: str, cache_dir: str | Path) -> Path:
    """The GGUF of ``model_dir`` as ``kind``, written once per version of its weights under ``cache_dir``."""
    model_dir = Path(model_dir).resolve()
    stamp = hashlib.sha256()
    for f in [*safetensors_files(model_dir), model_dir / "config.json", model_dir / "tokenizer.json"]:
        st = f.stat()
        stamp.update(f"{f}:{st.st_size}:{st.st_mtime_ns}".encode())
    path = Path(cache_dir) / f"{model_dir.name}-{stamp.hexdigest()[:12]}-{kind}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        export(model_dir, path, kind)
    return path
