"""Which token engine serves: the machine's capabilities, the engine manifest, and ``model.backend``.

A TensorRT-LLM engine only runs on the GPU model and library versions it was built with, so
``build_engine.py`` writes ``lyre-manifest.json`` beside it and loading compares the manifest
with this machine (:func:`manifest_mismatches`). ``model.backend: auto`` picks TensorRT-LLM when an
engine is built, the library imports and a GPU is present, else PyTorch; :func:`select_backend`
returns the choice and the reason, which the service logs.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("lyre.engine")

MANIFEST_NAME = "lyre-manifest.json"
MANIFEST_VERSION = 1
FP8_MIN_CAPABILITY = (8, 9)  # Ada, Hopper, Blackwell


class BackendError(RuntimeError):
    """The requested backend cannot serve on this machine; the message says what is missing."""


@dataclass(frozen=True)
class Environment:
    """What this machine offers a TensorRT-LLM engine."""

    gpu_name: str | None = None  # None: no CUDA GPU visible
    compute_capability: tuple[int, int] | None = None
    tensorrt_llm_version: str | None = None  # None: the library is not installed / does not import
    tensorrt_version: str | None = None
    import_error: str | None = None  # why tensorrt_llm did not import, when it did not

    @property
    def has_gpu(self) -> bool:
        return self.gpu_name is not None

    @property
    def supports_fp8(self) -> bool:
        return self.compute_capability is not None and tuple(self.compute_capability) >= FP8_MIN_CAPABILITY

    def describe(self) -> str:
        gpu = (f"{self.gpu_name} (compute capability {self.compute_capability[0]}.{self.compute_capability[1]})"
               if self.has_gpu and self.compute_capability else "no CUDA GPU")
        lib = (f"TensorRT-LLM {self.tensorrt_llm_version}, TensorRT {self.tensorrt_version or '?'}"
               if self.tensorrt_llm_version else f"no TensorRT-LLM: {self.import_error or 'not installed'}")
        return f"{gpu}; {lib}"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe_environment(import_library: bool = True) -> Environment:
    """Look at this machine: the first CUDA GPU (through torch) and the installed TensorRT-LLM.

    ``import_library`` also imports ``tensorrt_llm`` (slow, and it needs CUDA); without it only
    the installed distribution versions are read.
    """
    import torch

    gpu_name = capability = None
    if torch.cuda.is_available():
        gpu_name = torch.cuda.get_device_name(0)
        capability = tuple(torch.cuda.get_device_capability(0))
    trt_llm, trt, error = _version("tensorrt-llm") or _version("tensorrt_llm"), _version("tensorrt"), None
    if trt_llm is None:
        error = "the tensorrt-llm package is not installed (./setup.sh installs it on machines with an NVIDIA GPU)"
    elif import_library:
        try:
            import tensorrt_llm  # noqa: F401
        except Exception as e:  # ImportError, missing CUDA/MPI libraries...
            trt_llm, error = None, f"import tensorrt_llm failed: {type(e).__name__}: {e}"
    return Environment(gpu_name, capability, trt_llm, trt, error)


# --------------------------------------------------------------------------------------------
# the manifest written beside an engine


@dataclass
class Manifest:
    model_source: str  # the directory or Hugging Face id@revision the engine was built from
    model_revision: str  # the Hugging Face commit, or "local"
    model_sha256: str  # of the checkpoint's config and weight files
    tensorrt_llm_version: str
    tensorrt_version: str
    gpu_name: str
    compute_capability: list[int]
    quantization: str  # what was built: fp8 | fp16 | bf16
    kv_cache_dtype: str
    build: dict[str, Any] = field(default_factory=dict)  # the build section used
    calibration: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    lyre_version: str = ""
    manifest_version: int = MANIFEST_VERSION

    def write(self, engine_dir: str | Path) -> Path:
        path = Path(engine_dir) / MANIFEST_NAME
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, engine_dir: str | Path) -> Manifest:
        path = Path(engine_dir) / MANIFEST_NAME
        if not path.is_file():
            raise BackendError(
                f"{engine_dir} has no {MANIFEST_NAME}: it was not built by build_engine.py (or the build did not "
                f"finish). Rebuild it: python build_engine.py --config config/model_config.yaml"
            )
        try:
            data = json.loads(path.read_text())
            known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
            return cls(**known)
        except (ValueError, TypeError) as e:
            raise BackendError(f"{path} is not a valid engine manifest ({e}); rebuild the engine") from None


def manifest_mismatches(manifest: Manifest, env: Environment) -> list[str]:
    """Each way this machine differs from the one the engine was built for (empty: it can load)."""
    problems = []
    if not env.has_gpu:
        problems.append("this machine has no CUDA GPU")
    else:
        if env.gpu_name != manifest.gpu_name:
            problems.append(f"GPU: built for {manifest.gpu_name}, this machine has {env.gpu_name}")
        if env.compute_capability and list(env.compute_capability) != list(manifest.compute_capability):
            problems.append(f"compute capability: built for {'.'.join(map(str, manifest.compute_capability))}, "
                            f"this GPU is {'.'.join(map(str, env.compute_capability))}")
    if env.tensorrt_llm_version != manifest.tensorrt_llm_version:
        problems.append(f"TensorRT-LLM: built with {manifest.tensorrt_llm_version}, "
                        f"installed {env.tensorrt_llm_version or 'none'}")
    if env.tensorrt_version != manifest.tensorrt_version:
        problems.append(f"TensorRT: built with {manifest.tensorrt_version}, installed {env.tensorrt_version or 'none'}")
    return problems


def check_manifest(engine_dir: str | Path, env: Environment) -> Manifest:
    """The engine's manifest, or BackendError naming every mismatch with this machine."""
    manifest = Manifest.read(engine_dir)
    problems = manifest_mismatches(manifest, env)
    if problems:
        raise BackendError(
            f"the engine in {engine_dir} does not match this machine: " + "; ".join(problems) + ". An engine runs only "
            "on the GPU model and library versions it was built with: rebuild it here with "
            "`python build_engine.py --config config/model_config.yaml`, or serve with --set model.backend=torch"
        )
    return manifest


def hash_files(paths: Iterable[Path], progress: bool = False) -> str:
    """sha256 over the files' names and contents, in name order (weights are read in 8 MiB blocks)."""
    from tqdm import tqdm

    files = sorted(paths, key=lambda p: p.name)
    digest = hashlib.sha256()
    with tqdm(total=sum(p.stat().st_size for p in files), unit="B", unit_scale=True, desc="hashing the checkpoint",
              disable=not progress) as bar:
        for path in files:
            digest.update(path.name.encode() + b"\0")
            with path.open("rb") as f:
                while block := f.read(8 << 20):
                    digest.update(block)
                    bar.update(len(block))
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# model.backend


@dataclass(frozen=True)
class BackendChoice:
    name: str  # "torch" | "trtllm"
    reason: str


def select_backend(requested: str, engine_dir: str | Path, env: Environment) -> BackendChoice:
    """Resolve ``model.backend`` (auto | torch | trtllm) for this machine.

    ``trtllm`` that cannot run raises BackendError saying what is missing; ``auto`` falls back
    to torch and says why.
    """
    if requested == "torch":
        return BackendChoice("torch", "model.backend is torch")
    engine_dir = Path(engine_dir)
    missing = []
    if not env.has_gpu:
        missing.append("no CUDA GPU is visible")
    if env.tensorrt_llm_version is None:
        missing.append(env.import_error or "TensorRT-LLM is not installed")
    if not (engine_dir / MANIFEST_NAME).is_file():
        missing.append(f"no engine is built at {engine_dir} (build.engine_dir): run python build_engine.py")
    if not missing:
        return BackendChoice("trtllm", f"engine {engine_dir} found, {env.describe()}")
    if requested == "trtllm":
        raise BackendError("model.backend is trtllm but " + "; ".join(missing)
                           + ". Use --set model.backend=torch (or auto) to serve with the PyTorch backend.")
    return BackendChoice("torch", "auto: the TensorRT-LLM backend is not usable here (" + "; ".join(missing) + ")")
