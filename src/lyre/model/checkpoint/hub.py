"""Checkpoints on the Hugging Face hub: downloads fetch only the files Lyre loads (never the optimizer
states and intermediate checkpoints that Orpheus's repository also holds), with progress bars;
the local cache is searched without the network. A kind says what is fetched: ``llama`` (Orpheus),
``snac``, ``qwen3-tts`` (a whole Qwen3-TTS checkpoint, its codec in ``speech_tokenizer/``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lyre.errors import CheckpointError
from lyre.model.checkpoint.llama import safetensors_files

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
# A Qwen3-TTS repository (Qwen/Qwen3-TTS-12Hz-*): the model, Qwen's text tokenizer as published and
# its codec in speech_tokenizer/ (named, since fnmatch's "*" also matches "/": nothing else nested)
QWEN3TTS_PATTERNS = ["config.json", "generation_config.json", "model.safetensors", "model-*-of-*.safetensors",
                     "model.safetensors.index.json", "vocab.json", "merges.txt", "tokenizer.json",
                     "tokenizer_config.json", "special_tokens_map.json", "preprocessor_config.json",
                     "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors",
                     "speech_tokenizer/preprocessor_config.json"]
# fnmatch's "*" also matches "/": keep subfolders (checkpoint-*/, global_step*/) out explicitly.
IGNORE_PATTERNS = ["*/*"]
KINDS = {"llama": (LLAMA_PATTERNS, IGNORE_PATTERNS), "snac": (SNAC_PATTERNS, IGNORE_PATTERNS),
         "qwen3-tts": (QWEN3TTS_PATTERNS, ["*/*/*"])}


def _patterns(kind: str) -> tuple[list[str], list[str]]:
    """(allow, ignore) patterns of ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    return KINDS[kind]


def _is_complete(path: Path, kind: str) -> bool:
    if not (path / "config.json").is_file():
        return False
    if kind == "snac":
        return (path / "pytorch_model.bin").is_file() or (path / "model.safetensors").is_file()
    if kind == "qwen3-tts":
        text = (path / "tokenizer.json").is_file() or all((path / n).is_file() for n in ("vocab.json", "merges.txt"))
        codec = path / "speech_tokenizer"
        if not (text and (codec / "config.json").is_file() and (codec / "model.safetensors").is_file()):
            return False
    elif not (path / "tokenizer.json").is_file():
        return False
    try:
        safetensors_files(path)
    except CheckpointError:
        return False
    return True


def _snapshot(repo_id: str, kind: str, revision: str, cache_dir: str | Path | None, **kwargs: Any) -> Path:
    """``snapshot_download`` of the files Lyre needs from ``repo_id`` (top level only)."""
    from huggingface_hub import snapshot_download

    allow, ignore = _patterns(kind)
    return Path(
        snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=allow,
            ignore_patterns=ignore,
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

    setting = "codec.path" if kind == "snac" else "model.path"

    def unreachable(e: Exception) -> str:
        return (f"cannot download {repo_id}@{revision}: the Hugging Face hub is not reachable from here "
                f"({type(e).__name__}). Copy the checkpoint onto this machine and set {setting} to its directory.")

    try:
        path = _snapshot(repo_id, kind, revision, cache_dir, endpoint=endpoint)
    except GatedRepoError:
        raise CheckpointError(
            f"{repo_id} is gated: accept its licence on Hugging Face, then log in (`hf auth login`) or set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"{repo_id} does not exist on Hugging Face (or is private: log in first)") from None
    except LocalEntryNotFoundError as e:  # (before HfHubHTTPError: huggingface_hub < 1 derives it from that)
        raise CheckpointError(unreachable(e)) from None
    except HfHubHTTPError as e:
        raise CheckpointError(f"cannot download {repo_id}@{revision}: the Hugging Face hub answered {e}") from None
    except OSError as e:  # (after HfHubHTTPError, which huggingface_hub < 1 derives from OSError)
        raise CheckpointError(unreachable(e)) from None
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
