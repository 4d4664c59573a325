"""Loading checkpoints as published, downloading them, and choosing the default model.

- Llama checkpoints in Hugging Face format: ``config.json``, ``model.safetensors`` or sharded
  ``model-0000N-of-0000M.safetensors`` with ``model.safetensors.index.json``, ``tokenizer.json``.
- SNAC directories: ``config.json`` with ``pytorch_model.bin`` or ``model.safetensors``.
- Downloads by Hugging Face id fetch only the files above (never the optimizer states and
  intermediate checkpoints that Orpheus's repository also holds), with progress bars.
- Default resolution: ``model.path`` when set, else ``model.hf_id`` when already in the local
  Hugging Face cache, else the demo checkpoint (random weights: its audio is noise), said loudly.

``lyre checkpoint {demo,download,resolve}`` is the command-line face of this module.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lyre.config import CodecConfig, ModelConfig
from lyre.model import demo

log = logging.getLogger("lyre.checkpoint")

# Files fetched from a Llama repository (top level only) and from a SNAC repository.
LLAMA_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
]
SNAC_PATTERNS = ["config.json", "pytorch_model.bin", "*.safetensors"]
# fnmatch's "*" also matches "/": keep subfolders (checkpoint-*/, global_step*/) out explicitly.
IGNORE_PATTERNS = ["*/*"]
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, malformed or cannot be fetched."""


# --------------------------------------------------------------------------------------------
# Llama


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


def read_llama_config(model_dir: str | Path) -> LlamaConfig:
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{model_dir} is not a checkpoint directory: {path.name} is missing") from None
    except ValueError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None
    return LlamaConfig.from_dict(raw, str(path))


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
    """All weights of a Llama checkpoint, checked against its config, optionally cast."""
    from safetensors.torch import load_file

    config = config or read_llama_config(model_dir)
    weights: dict[str, torch.Tensor] = {}
    for f in safetensors_files(model_dir):
        for name, t in load_file(str(f), device=str(device)).items():
            weights[name] = t.to(dtype) if dtype is not None and t.is_floating_point() else t
    check_llama_weights(weights, config, str(model_dir))
    return weights


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


# --------------------------------------------------------------------------------------------
# SNAC


def load_snac(
    snac_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.nn.Module:
    """A SNAC model from ``config.json`` + ``pytorch_model.bin`` or ``model.safetensors``, in eval mode."""
    from snac import SNAC

    snac_dir = Path(snac_dir)
    cfg_path = snac_dir / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{snac_dir} is not a SNAC directory: config.json is missing") from None
    except ValueError as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from None
    try:
        model = SNAC(**cfg)
    except TypeError as e:
        raise CheckpointError(f"{cfg_path} does not describe a SNAC model: {e}") from None
    if (snac_dir / "model.safetensors").is_file():
        from safetensors.torch import load_file

        state = load_file(str(snac_dir / "model.safetensors"))
    elif (snac_dir / "pytorch_model.bin").is_file():
        state = torch.load(snac_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise CheckpointError(f"{snac_dir} holds no SNAC weights (pytorch_model.bin or model.safetensors)")
    try:
        # Old-style weight_g/weight_v keys are converted by torch's weight_norm load hook.
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{snac_dir}: weights do not match config.json: {str(e).splitlines()[0]}") from None
    return model.to(device=device, dtype=dtype).eval()


# --------------------------------------------------------------------------------------------
# Hugging Face hub


def _patterns(kind: str) -> list[str]:
    if kind not in ("llama", "snac"):
        raise ValueError(f"kind must be 'llama' or 'snac', not {kind!r}")
    return LLAMA_PATTERNS if kind == "llama" else SNAC_PATTERNS


def _is_complete(path: Path, kind: str) -> bool:
    if not (path / "config.json").is_file():
        return False
    if kind == "snac":
        return (path / "pytorch_model.bin").is_file() or (path / "model.safetensors").is_file()
    if not (path / "tokenizer.json").is_file():
        return False
    try:
        safetensors_files(path)
    except CheckpointError:
        return False
    return True


def _snapshot(repo_id: str, kind: str, revision: str, cache_dir: str | Path | None, **kwargs: Any) -> Path:
    """``snapshot_download`` of the files Lyre needs from ``repo_id`` (top level only)."""
    from huggingface_hub import snapshot_download

    return Path(
        snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=_patterns(kind),
            ignore_patterns=IGNORE_PATTERNS,
            cache_dir=cache_dir,
            **kwargs,
        )
    )


def download(
    repo_id: str,
    kind: str = "llama",
    revision: str = "main",
    cache_dir: str | Path | None = None,
    endpoint: str | None = None,
) -> Path:
    """Download the files Lyre needs from ``repo_id`` into the Hugging Face cache; return the directory.

    Progress bars come from ``huggingface_hub``. Fails with :class:`CheckpointError` when the
    hub cannot be reached or the repository is missing, gated or incomplete.
    """
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    setting = "model.path" if kind == "llama" else "codec.path"
    try:
        path = _snapshot(repo_id, kind, revision, cache_dir, endpoint=endpoint)
    except GatedRepoError:
        raise CheckpointError(
            f"{repo_id} is gated: accept its licence on Hugging Face, then log in (`hf auth login`) or set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"{repo_id} does not exist on Hugging Face (or is private: log in first)") from None
    except HfHubHTTPError as e:
        raise CheckpointError(f"cannot download {repo_id}@{revision}: the Hugging Face hub answered {e}") from None
    except (LocalEntryNotFoundError, OSError) as e:
        raise CheckpointError(
            f"cannot download {repo_id}@{revision}: the Hugging Face hub is not reachable from here "
            f"({type(e).__name__}). Copy the checkpoint onto this machine and set {setting} to its directory."
        ) from None
    if not _is_complete(path, kind):
        raise CheckpointError(f"{repo_id}@{revision} downloaded to {path} but lacks the files a {kind} checkpoint needs")
    return path


def find_cached(
    repo_id: str, kind: str = "llama", revision: str = "main", cache_dir: str | Path | None = None
) -> Path | None:
    """The local Hugging Face cache's complete copy of ``repo_id``, or None. Never uses the network."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = _snapshot(repo_id, kind, revision, cache_dir, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    return path if _is_complete(path, kind) else None


# --------------------------------------------------------------------------------------------
# default model resolution


@dataclass(frozen=True)
class ResolvedModel:
    llama_dir: Path
    snac_dir: Path
    is_demo: bool
    source: str  # how the Llama was found, for logs


DEMO_BANNER = """
************************************************************************************************
*  Lyre is using the DEMO checkpoint at {path}
*  Its weights are RANDOM: every sound it makes is NOISE, not speech.
*  For speech, set model.path to an Orpheus checkpoint directory or download {hf_id}
*  (`lyre checkpoint download`).
************************************************************************************************"""


def resolve_model(
    model: ModelConfig, codec: CodecConfig, cache_dir: str | Path | None = None, create_demo: bool = True
) -> ResolvedModel:
    """Choose the checkpoint to serve: local path, else cached Hugging Face id, else the demo."""
    if model.path is not None:
        llama_dir, is_demo, source = Path(model.path), False, f"model.path {model.path}"
        if not llama_dir.is_dir():
            raise CheckpointError(f"model.path {model.path} does not exist or is not a directory")
    elif (cached := find_cached(model.hf_id, "llama", model.revision, cache_dir)) is not None:
        llama_dir, is_demo, source = cached, False, f"Hugging Face cache {model.hf_id}@{model.revision}"
    else:
        if not model.allow_demo:
            raise CheckpointError(
                f"no model: model.path is not set and {model.hf_id}@{model.revision} is not in the local Hugging Face "
                f"cache, and model.allow_demo is false. Set model.path or run `lyre checkpoint download`."
            )
        demo_dir = Path(model.demo_dir)
        if create_demo:
            demo.ensure_demo(demo_dir)
        elif not demo.demo_is_current(demo_dir):
            raise CheckpointError(f"the demo checkpoint at {demo_dir} is missing; run `lyre checkpoint demo {demo_dir}`")
        llama_dir, is_demo, source = demo_dir / "llama", True, f"demo checkpoint {demo_dir}"
        log.warning(DEMO_BANNER.format(path=demo_dir, hf_id=model.hf_id))

    if codec.path is not None:
        snac_dir = Path(codec.path)
        if not snac_dir.is_dir():
            raise CheckpointError(f"codec.path {codec.path} does not exist or is not a directory")
    elif is_demo:
        snac_dir = Path(model.demo_dir) / "snac"
    elif (cached := find_cached(codec.hf_id, "snac", codec.revision, cache_dir)) is not None:
        snac_dir = cached
    else:
        raise CheckpointError(
            f"the model is real but SNAC {codec.hf_id}@{codec.revision} is not in the local Hugging Face cache: "
            f"set codec.path or run `lyre checkpoint download`"
        )
    log.info("model: %s (%s); codec: %s", llama_dir, source, snac_dir)
    return ResolvedModel(llama_dir=llama_dir, snac_dir=snac_dir, is_demo=is_demo, source=source)
