"""The demo checkpoint: a small seeded random Orpheus-shaped Llama, its tokenizer, and SNAC.

It is written in the formats of the real downloads (Hugging Face ``config.json`` +
``model.safetensors`` + ``tokenizer.json``; SNAC ``config.json`` + ``pytorch_model.bin``), so the
loading code is the one real checkpoints use. Every id of the Orpheus protocol is real: the Llama
has Orpheus's 156940-id vocabulary, and the tokenizer places Llama 3's and Orpheus's special tokens
at their ids while its text ids stay below 128000.

The weights are random: the audio it produces is NOISE. The files are byte-identical on every run
with the same seed and library versions.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from lyre.model import orpheus
from lyre.model.demo_tokenizer import build_demo_tokenizer

DEMO_FORMAT = 2  # bump when the demo's contents change; ensure_demo() then rewrites it
MARKER = "lyre-demo.json"
# A shape checkpoint (write_shape_checkpoint) holds this instead of weights: seeded random weights of its
# config's shape are made where they are loaded (lyre.model.checkpoint.random_weights: a GPU's 3B model
# without 6 GB on disk)
RANDOM_WEIGHTS = "random-weights.json"

SNAC_24KHZ_CONFIG: dict[str, Any] = {
    "sampling_rate": 24000,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}

# Orpheus's architecture in miniature: GQA ratio 3 (24/8 in the real model), llama3 RoPE scaling,
# tied embeddings, the full Orpheus vocabulary.
DEMO_LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": orpheus.VOCAB_SIZE,
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": orpheus.BOS,
    "eos_token_id": orpheus.END_OF_SPEECH,
    "pad_token_id": orpheus.PAD,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
}

# Model shapes the demo can take (random weights all): ``tiny``, the default, costs almost nothing a
# token (the stream count measures the codec); ``small`` costs what a real model's token costs on a
# CPU in proportion (hidden 768, 12 layers, 12 query / 4 KV heads), so the model bounds the streams.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "small": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
              "num_key_value_heads": 4, "head_dim": 64},
    # Orpheus-3B's (Llama-3.2-3B) shape: for shape checkpoints (write_shape_checkpoint), whose weights are made
    # where they are loaded; as a demo written to disk it takes 6.6 GB
    "3b": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
           "num_key_value_heads": 8, "head_dim": 128},
}
# what a config.json given as a shape may set (the rest, Orpheus's vocabulary and ids, stays the demo's)
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "rms_norm_eps", "rope_theta", "torch_dtype", "tie_word_embeddings")


def demo_config(shape: str | Path = "tiny") -> dict[str, Any]:
    """The demo Llama's config in ``shape``: a name of :data:`SHAPES`, or a ``config.json`` whose shape
    keys (:data:`SHAPE_KEYS`) it takes. Raises ValueError for an unknown name or an unusable file."""
    if str(shape) in SHAPES:
        return {**DEMO_LLAMA_CONFIG, **SHAPES[str(shape)]}
    path = Path(shape)
    if not path.is_file():
        raise ValueError(f"unknown shape {str(shape)!r}: one of {', '.join(SHAPES)}, or a config.json")
    try:
        given = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path} as a config.json: {e}") from None
    if not isinstance(given, dict):
        raise ValueError(f"{path} is not a JSON object")
    config = {**DEMO_LLAMA_CONFIG, **{k: given[k] for k in SHAPE_KEYS if k in given}}
    if "head_dim" not in given and "hidden_size" in given:
        config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    if config["num_attention_heads"] % config["num_key_value_heads"]:
        raise ValueError(f"{path}: num_attention_heads must be a multiple of num_key_value_heads")
    return config


def shape_name(shape: str | Path) -> str:
    """How the marker names a shape: its name, or the digest of the config it makes."""
    if str(shape) in SHAPES:
        return str(shape)
    return "config-" + hashlib.sha256(json.dumps(demo_config(shape), sort_keys=True).encode()).hexdigest()[:16]


_DEMO_README = """\
# Lyre demo checkpoint — NOT A REAL MODEL

Written by `lyre checkpoint demo`. The weights are seeded random numbers: everything
this checkpoint "says" is noise. It exists so that Lyre runs end to end, and its tests run, on a
machine without the real Orpheus weights. Set `model.path` or download `model.hf_id` for speech.
"""

def random_llama_weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Seeded random weights with Hugging Face Llama names, in ``config['torch_dtype']``.

    Uses numpy's PCG64 so the values do not depend on the torch version.
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    std = float(config.get("initializer_range", 0.02))
    h = config["hidden_size"]
    nh, nkv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or h // nh
    inter = config["intermediate_size"]
    dtype = getattr(torch, config.get("torch_dtype", "float32"))

    def normal(*shape: int) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * std).to(dtype)

    def norm_weight() -> torch.Tensor:  # near 1, not exactly, so a misapplied norm shows in tests
        return torch.from_numpy(1.0 + 0.1 * rng.standard_normal(h, dtype=np.float32)).to(dtype)

    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(config["vocab_size"], h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight()
        w[p + "self_attn.q_proj.weight"] = normal(nh * hd, h)
        w[p + "self_attn.k_proj.weight"] = normal(nkv * hd, h)
        w[p + "self_attn.v_proj.weight"] = normal(nkv * hd, h)
        w[p + "self_attn.o_proj.weight"] = normal(h, nh * hd)
        w[p + "post_attention_layernorm.weight"] = norm_weight()
        w[p + "mlp.gate_proj.weight"] = normal(inter, h)
        w[p + "mlp.up_proj.weight"] = normal(inter, h)
        w[p + "mlp.down_proj.weight"] = normal(h, inter)
    w["model.norm.weight"] = norm_weight()
    if not config.get("tie_word_embeddings", False):
        w["lm_head.weight"] = normal(config["vocab_size"], h)
    return w


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_llama_checkpoint(
    out_dir: Path,
    config: dict[str, Any],
    seed: int,
    tokenizer: Any | None = None,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write a random Llama in Hugging Face format; sharded with an index when it exceeds
    ``max_shard_bytes``. Used for the demo and for tests of other model shapes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = random_llama_weights(config, seed)
    _write_json(out_dir / "config.json", config)
    _write_json(
        out_dir / "generation_config.json",
        {
            "bos_token_id": orpheus.BOS,
            "eos_token_id": list(orpheus.STOP_IDS),
            "pad_token_id": orpheus.PAD,
            "do_sample": True,
            "temperature": 0.6,
            "top_p": 0.8,
            "repetition_penalty": 1.1,
        },
    )
    metadata = {"format": "pt"}
    sizes = {k: t.numel() * t.element_size() for k, t in weights.items()}
    if max_shard_bytes is None or sum(sizes.values()) <= max_shard_bytes:
        save_file(weights, str(out_dir / "model.safetensors"), metadata=metadata)
    else:
        shards: list[dict[str, torch.Tensor]] = [{}]
        used = 0
        for name, t in weights.items():
            if shards[-1] and used + sizes[name] > max_shard_bytes:
                shards.append({})
                used = 0
            shards[-1][name] = t
            used += sizes[name]
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out_dir / fname), metadata=metadata)
            weight_map.update({name: fname for name in shard})
        _write_json(
            out_dir / "model.safetensors.index.json",
            {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map},
        )
    if tokenizer is not None:
        tokenizer.save(str(out_dir / "tokenizer.json"))
        _write_json(
            out_dir / "tokenizer_config.json",
            {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "model_max_length": 131072,
             "tokenizer_class": "PreTrainedTokenizerFast"},
        )
    return out_dir


def write_shape_checkpoint(out_dir: Path, shape: str | Path = "3b", seed: int = 0) -> Path:
    """A Llama of ``shape`` (:func:`demo_config`) without weights: ``out_dir/llama`` holds its config,
    the demo tokenizer and ``random-weights.json``, so loading it makes seeded random weights on the
    loading device (nothing large on disk; its audio is noise, and a marker says it is a demo). Give
    the server a codec beside it (``codec.path``, e.g. the demo's SNAC). Returns the ``llama`` directory."""
    config = demo_config(shape)
    with replaced_directory(out_dir) as tmp:
        llama = tmp / "llama"
        llama.mkdir()
        _write_json(llama / "config.json", config)
        _write_json(llama / RANDOM_WEIGHTS, {"seed": seed})
        build_demo_tokenizer().save(str(llama / "tokenizer.json"))
        _write_json(tmp / MARKER, {"format": DEMO_FORMAT, "seed": seed, "shape": shape_name(shape),
                                   "weights": "random, made where loaded", "files": _digest(tmp)})
    return Path(out_dir) / "llama"


def write_snac_checkpoint(out_dir: Path, seed: int) -> Path:
    """SNAC with the 24 kHz configuration and seeded random weights, as ``pytorch_model.bin``."""
    from snac import SNAC

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(out_dir / "config.json", SNAC_24KHZ_CONFIG)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SNAC(**SNAC_24KHZ_CONFIG)
    torch.save(model.state_dict(), out_dir / "pytorch_model.bin")
    return out_dir


def _digest(root: Path) -> dict[str, str]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MARKER)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def write_demo(out_dir: Path, seed: int = 0, shape: str | Path = "tiny") -> Path:
    """Write the demo checkpoint to ``out_dir`` (``llama/`` and ``snac/``) in ``shape``
    (:func:`demo_config`), replacing it atomically."""
    config = demo_config(shape)
    with replaced_directory(out_dir) as tmp:
        write_llama_checkpoint(tmp / "llama", config, seed, tokenizer=build_demo_tokenizer())
        (tmp / "llama" / "README.md").write_text(_DEMO_README)
        write_snac_checkpoint(tmp / "snac", seed)
        marker = {"format": DEMO_FORMAT, "seed": seed, "shape": shape_name(shape), "files": _digest(tmp)}
        _write_json(tmp / MARKER, marker)
    return Path(out_dir)


@contextmanager
def replaced_directory(out_dir: str | Path) -> Iterator[Path]:
    """A fresh directory beside ``out_dir`` to write into; when the block ends without an error it
    replaces ``out_dir`` whole (a reader never sees half a checkpoint), else it is removed."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        yield tmp
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def demo_is_current(out_dir: Path, seed: int = 0, shape: str | Path = "tiny") -> bool:
    """True when ``out_dir`` holds a complete demo of this format, seed and shape (files not re-hashed)."""
    try:
        marker = json.loads((Path(out_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("format") != DEMO_FORMAT or marker.get("seed") != seed:
        return False
    if marker.get("shape", "tiny") != shape_name(shape):
        return False
    return all((Path(out_dir) / name).is_file() for name in marker.get("files", {}))


def ensure_demo(out_dir: Path, seed: int = 0, shape: str | Path = "tiny") -> Path:
    """The demo checkpoint at ``out_dir``, written first if missing, stale, incomplete or of another shape."""
    if not demo_is_current(out_dir, seed, shape):
        write_demo(out_dir, seed, shape)
    return Path(out_dir)


def is_demo_llama(llama_dir: Path) -> bool:
    """Whether ``llama_dir`` is the ``llama/`` of a demo checkpoint (of any shape)."""
    return (Path(llama_dir).parent / MARKER).is_file() and Path(llama_dir).name == "llama"
