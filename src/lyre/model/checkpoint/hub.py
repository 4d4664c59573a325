"""Checkpoints on the Hugging Face hub: downloads fetch only the files Lyre loads (never the optimizer
states and intermediate checkpoints that Orpheus's repository also holds), with progress bars;
the local cache is searched without the network."""

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
# fnmatch's "*" also matches "/": keep subfolders (checkpoint-*/, global_step*/) out explicitly.
IGNORE_PATTERNS = ["*/*"]


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
