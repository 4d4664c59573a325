"""Llama checkpoints in Hugging Face format: ``config.json``, ``model.safetensors`` or sharded
``model-0000N-of-0000M.safetensors`` with ``model.safetensors.index.json``, and ``tokenizer.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lyre.errors import CheckpointError
from lyre.model.demo import RANDOM_WEIGHTS

INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class LlamaConfig:
    """The architecture fields of a Hugging Face Llama ``config.json``."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    torch_dtype: str
    qk_norm: bool = False  # Qwen3: an RMSNorm over each query and key head before RoPE

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config.json") -> LlamaConfig:
        model_type = d.get("model_type")
        if model_type != "llama":
            raise CheckpointError(f"{source}: model_type is {model_type!r}; Lyre loads Llama checkpoints ('llama')")
        required = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"]
        missing = [k for k in required if k not in d]
        if missing:
            raise CheckpointError(f"{source}: missing {', '.join(missing)}")
        heads = int(d["num_attention_heads"])
        kv_heads = int(d.get("num_key_value_heads") or heads)
        head_dim = int(d.get("head_dim") or d["hidden_size"] // heads)
        if heads % kv_heads:
            raise CheckpointError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        rope_scaling = d.get("rope_scaling")
        if rope_scaling is not None:
            kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
            if kind not in ("llama3", "default", None):
                raise CheckpointError(f"{source}: rope_scaling type {kind!r} is not supported (llama3 or none)")
        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(d.get("rope_theta", 10000.0)),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
        )

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint of this config holds, with its shape."""
        h, hd, inter = self.hidden_size, self.head_dim, self.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, h)}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "self_attn.q_proj.weight"] = (self.num_attention_heads * hd, h)
            shapes[p + "self_attn.k_proj.weight"] = (self.num_key_value_heads * hd, h)
            shapes[p + "self_attn.v_proj.weight"] = (self.num_key_value_heads * hd, h)
            shapes[p + "self_attn.o_proj.weight"] = (h, self.num_attention_heads * hd)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
            shapes[p + "mlp.gate_proj.weight"] = (inter, h)
            shapes[p + "mlp.up_proj.weight"] = (inter, h)
            shapes[p + "mlp.down_proj.weight"] = (h, inter)
        shapes["model.norm.weight"] = (h,)
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        return shapes


def read_config_json(directory: str | Path, what: str = "a checkpoint directory") -> dict:
    """``directory``'s config.json; CheckpointError saying it is not ``what`` when it is missing, or
    not JSON."""
    path = Path(directory) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{directory} is not {what}: {path.name} is missing") from None
    except ValueError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None


def read_llama_config(model_dir: str | Path) -> LlamaConfig:
    return LlamaConfig.from_dict(read_config_json(model_dir), str(Path(model_dir) / "config.json"))


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The weight files of a checkpoint: the index's shards, or the single file."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{index} is malformed: {e}") from None
        shards = sorted({model_dir / name for name in weight_map.values()})
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise CheckpointError(
                f"{model_dir} is incomplete: {len(missing)} of {len(shards)} shards named in {INDEX_FILE} are "
                f"missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); download it again"
            )
        return shards
    files = sorted(model_dir.glob("*.safetensors"))
    if len(files) == 1:
        return files
    if not files:
        raise CheckpointError(
            f"{model_dir} holds no *.safetensors weights (Lyre loads safetensors checkpoints as published on "
            f"Hugging Face)"
        )
    raise CheckpointError(f"{model_dir} holds {len(files)} *.safetensors files but no {INDEX_FILE} to say how they fit")


def load_llama_weights(
    model_dir: str | Path,
    config: LlamaConfig | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """All weights of a Llama checkpoint, checked against its config, optionally cast (a shape
    checkpoint's: seeded random weights made on ``device``, in ``dtype`` or its config's)."""
    from safetensors.torch import load_file

    config = config or read_llama_config(model_dir)
    marker = Path(model_dir) / RANDOM_WEIGHTS
    if marker.is_file():
        try:
            seed = int(json.loads(marker.read_text())["seed"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{marker} is malformed: {e}") from None
        return random_weights(config, seed, dtype or getattr(torch, config.torch_dtype), device)
    weights: dict[str, torch.Tensor] = {}
    for f in safetensors_files(model_dir):
        for name, t in load_file(str(f), device=str(device)).items():
            weights[name] = t.to(dtype) if dtype is not None and t.is_floating_point() else t
    check_llama_weights(weights, config, str(model_dir))
    return weights


def random_weights(config: LlamaConfig, seed: int, dtype: torch.dtype, device: str | torch.device
                   ) -> dict[str, torch.Tensor]:
    """Seeded random weights of every tensor ``config`` implies, made on ``device`` (normal, std 0.02;
    norms near 1). Not the demo's values (numpy's, on the host): these are for shapes too large to write."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in config.weight_shapes().items():
        t = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
        out[name] = (1.0 + 0.1 * t if name.endswith("norm.weight") else 0.02 * t).to(dtype)
    return out


def check_llama_weights(weights: dict[str, torch.Tensor], config: LlamaConfig, source: str) -> None:
    check_weight_shapes({name: tuple(t.shape) for name, t in weights.items()}, config, source)


def check_weight_shapes(shapes: dict[str, tuple[int, ...]], config: LlamaConfig, source: str) -> None:
    """Every weight ``config`` implies is present with its shape (CheckpointError naming the first that is not)."""
    expected = config.weight_shapes()
    missing = [n for n in expected if n not in shapes]
    if missing:
        raise CheckpointError(f"{source}: {len(missing)} weights missing, first {missing[0]}")
    for name, shape in expected.items():
        if shapes[name] != shape:
            raise CheckpointError(f"{source}: {name} has shape {shapes[name]}, config.json implies {shape}")
    # Extra tensors (rotary inv_freq buffers, a redundant lm_head with tied embeddings) are ignored.


def load_tokenizer(model_dir: str | Path) -> Any:
    """The ``tokenizers.Tokenizer`` of a checkpoint directory (``tokenizer.json``)."""
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{model_dir} has no tokenizer.json (Lyre needs the fast tokenizer file)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise CheckpointError(f"{path} could not be read: {e}") from None
