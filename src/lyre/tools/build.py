"""The offline engine build behind ``build_engine.py``: plan, TensorRT-LLM build, manifest
(the FP8 calibration set is :mod:`lyre.tools.calibration`).

Everything up to the TensorRT-LLM call runs anywhere (the plan, the checks, the calibration set,
the manifest) and is tested on CPU. :func:`build_trtllm_engine` itself is NOT YET RUN ON A GPU BY
THIS PROJECT: it was written against TensorRT-LLM 1.2.1's ``tensorrt_llm._tensorrt_engine.LLM``
(``BuildConfig``, ``QuantConfig(quant_algo=FP8)``, ``CalibConfig`` with a local dataset
directory, a small ``KvCacheConfig``, ``llm.save``) from its sources; ``tests/tools/test_build.py``
holds the arguments to a snapshot of those classes' fields (``tests/support/trtllm_api/``).
"""

from __future__ import annotations

import datetime
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lyre import __version__
from lyre.config import LyreConfig
from lyre.engine.backend import MANIFEST_NAME, Environment, Manifest, hash_files
from lyre.errors import BuildError
from lyre.model import checkpoint
from lyre.tools.calibration import (
    CONTINUATION_TOKENS,
    STAGED_TOKENIZER_FILES,
    checkpoint_dtype,
    write_calibration_set,
)

__all__ = ["BuildError", "BuildPlan", "build_trtllm_engine", "format_plan", "plan_build", "prepare_torch"]

log = logging.getLogger("lyre.build")

QUANT_DTYPE = {"fp16": "float16", "bf16": "bfloat16"}
BF16_MIN_CAPABILITY = (8, 0)


# --------------------------------------------------------------------------------------------
# the plan


@dataclass
class BuildPlan:
    model: str  # the checkpoint: a directory, or a Hugging Face id@revision
    download: bool  # the checkpoint must be downloaded first
    engine_dir: Path
    requested_quantization: str
    quantization: str  # what will be built (after any fallback)
    dtype: str  # activation / KV cache dtype of the engine
    build: dict[str, Any]
    calibration: dict[str, Any]
    environment: Environment
    warnings: list[str] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)  # what stops a real build on this machine


def plan_build(cfg: LyreConfig, env: Environment, force: bool = False) -> BuildPlan:
    """What a build with ``cfg`` would do on a machine like ``env`` (no side effects)."""
    b = cfg.build
    warnings, blockers = [], []
    model_path = cfg.model.path
    if model_path is not None:
        model, download = model_path, False
        if not Path(model_path).is_dir():
            blockers.append(f"model.path {model_path} is not a directory")
    else:
        cached = checkpoint.find_cached(cfg.model.hf_id, "llama", cfg.model.revision)
        model, download = (str(cached), False) if cached else (f"{cfg.model.hf_id}@{cfg.model.revision}", True)

    quant = b.quantization
    capability = env.compute_capability
    if quant == "fp8" and env.has_gpu and not env.supports_fp8:
        wanted = b.kv_cache_dtype if b.kv_cache_dtype != "auto" else checkpoint_dtype(model, download)
        fallback = "fp16" if wanted == "float16" else "bf16"
        warnings.append(
            f"FP8 needs compute capability >= 8.9 (Ada, Hopper, Blackwell); {env.gpu_name} is "
            f"{capability[0]}.{capability[1]}: building {fallback.upper()} weights instead (no calibration)"
        )
        quant = fallback
    if quant == "bf16" and capability is not None and tuple(capability) < BF16_MIN_CAPABILITY:
        warnings.append(f"BF16 needs compute capability >= 8.0; {env.gpu_name} is {capability[0]}.{capability[1]}: "
                        f"building FP16 instead")
        quant = "fp16"
    dtype = (b.kv_cache_dtype if b.kv_cache_dtype != "auto" else checkpoint_dtype(model, download)) if quant == "fp8" \
        else QUANT_DTYPE[quant]
    if quant != "fp8" and b.kv_cache_dtype not in ("auto", dtype):
        warnings.append(f"build.kv_cache_dtype {b.kv_cache_dtype} is ignored for {quant} weights: "
                        f"the KV cache follows the model dtype ({dtype})")
    if dtype == "bfloat16" and capability is not None and tuple(capability) < BF16_MIN_CAPABILITY:
        dtype = "float16"
        warnings.append("the KV cache falls back to float16 (BF16 needs compute capability >= 8.0)")
    if b.max_input_len >= b.max_seq_len:
        blockers.append(f"build.max_input_len ({b.max_input_len}) must be < build.max_seq_len ({b.max_seq_len})")
    if b.max_batch_size < cfg.scheduler.max_concurrent_sessions:
        warnings.append(f"build.max_batch_size {b.max_batch_size} < scheduler.max_concurrent_sessions "
                        f"{cfg.scheduler.max_concurrent_sessions}: at most {b.max_batch_size} sessions generate at once")

    engine_dir = Path(b.engine_dir)
    if engine_dir.exists() and any(engine_dir.iterdir()):
        if force:
            warnings.append(f"{engine_dir} exists and will be replaced (--force)")
        else:
            blockers.append(f"{engine_dir} already holds an engine or other files: pass --force to replace it, "
                            f"or set build.engine_dir")
    if not env.has_gpu:
        blockers.append("no CUDA GPU is visible (TensorRT-LLM builds for, and on, the GPU that will serve)")
    if env.tensorrt_llm_version is None:
        blockers.append(env.import_error or "TensorRT-LLM is not installed")

    calibration = {
        "samples": b.calibration_samples if quant == "fp8" else 0,
        "voices": list(cfg.model.voices),
        "continuation_tokens": CONTINUATION_TOKENS,
    }
    return BuildPlan(model, download, engine_dir, b.quantization, quant, dtype, b.model_dump(mode="json"), calibration, env,
                     warnings, blockers)


def format_plan(plan: BuildPlan) -> str:
    b = plan.build
    env = plan.environment
    fetch = "download (only the files the engine needs, with progress)" if plan.download else "local"
    lines = [
        "TensorRT-LLM engine build plan",
        f"  machine:        {env.describe()}",
        f"  model:          {plan.model} ({fetch})",
        f"  weights:        {plan.quantization.upper()}"
        + (f" (requested {plan.requested_quantization.upper()})" if plan.quantization != plan.requested_quantization
           else ""),
        f"  dtype:          {plan.dtype if plan.dtype != 'auto' else 'the checkpoint dtype (read once downloaded)'} "
        f"(activations and KV cache, not quantized)",
        f"  limits:         max_batch_size {b['max_batch_size']}, max_seq_len {b['max_seq_len']}, "
        f"max_input_len {b['max_input_len']}, max_num_tokens {b['max_num_tokens']}",
        f"  paged context FMHA: {'on' if b['use_paged_context_fmha'] else 'off'}",
    ]
    if plan.quantization == "fp8":
        c = plan.calibration
        lines.append(f"  calibration:    {c['samples']} Orpheus prompts over {len(c['voices'])} voices "
                     f"({', '.join(c['voices'])}), each + audio tokens the model generates to one length "
                     f"(the longest prompt + {c['continuation_tokens']}: no padding), tokenized as served")
    else:
        lines.append("  calibration:    none (no FP8)")
    lines += [
        f"  output:         {plan.engine_dir}/ with {MANIFEST_NAME} (model revision and hash, TensorRT-LLM and "
        f"TensorRT versions, GPU and compute capability, build settings)",
        "  steps:          1 resolve/download the checkpoint  2 hash it  3 build the calibration set  "
        "4 quantize + build (TensorRT-LLM)  5 save the engine + manifest",
    ]
    lines += [f"  warning:        {w}" for w in plan.warnings]
    if plan.blockers:
        lines.append("  a real build here stops at once:")
        lines += [f"    - {x}" for x in plan.blockers]
    else:
        lines.append("  ready to build on this machine")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# the build (GPU)


def model_summary(model_dir: Path) -> dict[str, int]:
    c = checkpoint.read_llama_config(model_dir)
    return {"num_hidden_layers": c.num_hidden_layers, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "vocab_size": c.vocab_size, "hidden_size": c.hidden_size}


def resolve_checkpoint(cfg: LyreConfig) -> tuple[Path, str]:
    """The Llama checkpoint directory (downloaded if needed) and its revision."""
    if cfg.model.path is not None:
        path = Path(cfg.model.path)
        if not path.is_dir():
            raise BuildError(f"model.path {path} is not a directory")
        return path, "local"
    path = checkpoint.find_cached(cfg.model.hf_id, "llama", cfg.model.revision)
    if path is None:
        path = checkpoint.download(cfg.model.hf_id, "llama", cfg.model.revision)
    # The Hugging Face cache keeps each revision in snapshots/<commit hash>/.
    return path, path.name if path.parent.name == "snapshots" else cfg.model.revision


BUILD_KV_CACHE_FRACTION = 0.05  # the build-time LLM starts an executor it never uses: a small KV cache


def load_llmapi() -> SimpleNamespace:
    """The TensorRT-LLM 1.2.1 classes the build uses (imports only here: the library is optional).

    ``CalibConfig`` comes from ``tensorrt_llm.llmapi.llm_args``, the module that defines it and
    types ``TrtLlmArgs.calib_config`` with it (``tensorrt_llm.llmapi`` re-exports the same
    object), falling back to ``tensorrt_llm.llmapi``, then to ``tensorrt_llm._tensorrt_engine.llm_args``
    (where later releases define the TensorRT engine's own arguments), should a release move it."""
    import tensorrt_llm
    from tensorrt_llm._tensorrt_engine import LLM
    from tensorrt_llm.llmapi import BuildConfig, KvCacheConfig, QuantAlgo, QuantConfig

    return SimpleNamespace(version=tensorrt_llm.__version__, LLM=LLM, BuildConfig=BuildConfig,
                           CalibConfig=_calib_config(), KvCacheConfig=KvCacheConfig, QuantAlgo=QuantAlgo,
                           QuantConfig=QuantConfig)


CALIB_CONFIG_MODULES = ("tensorrt_llm.llmapi.llm_args", "tensorrt_llm.llmapi", "tensorrt_llm._tensorrt_engine.llm_args")


def _calib_config() -> type:
    import importlib

    tried = []
    for name in CALIB_CONFIG_MODULES:
        try:
            return importlib.import_module(name).CalibConfig
        except (ImportError, AttributeError) as e:
            tried.append(f"{name} ({type(e).__name__})")
    raise BuildError("this TensorRT-LLM has no CalibConfig where Lyre looks for it: " + ", ".join(tried))


def llm_arguments(api: SimpleNamespace, cfg: LyreConfig, plan: BuildPlan, model_dir: Path,
                  calibration: dict[str, Any] | None) -> dict[str, Any]:
    """Keyword arguments of the build-time ``LLM`` (``TrtLlmArgs`` fields): the build limits, a
    small KV cache, and for FP8 the quantization and the calibration set written to
    ``calibration["dataset"]``."""
    b = cfg.build
    build_config = api.BuildConfig(
        max_batch_size=b.max_batch_size,
        max_seq_len=b.max_seq_len,  # explicit: unset, TensorRT-LLM deduces it from the model (131072 for Orpheus)
        max_input_len=b.max_input_len,
        max_num_tokens=b.max_num_tokens,
    )
    build_config.plugin_config.use_paged_context_fmha = b.use_paged_context_fmha
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "dtype": plan.dtype,
        "build_config": build_config,
        # LLM(...) starts an executor after building (and allocates its KV cache, 90% of free
        # memory by default); the build only saves the engine
        "kv_cache_config": api.KvCacheConfig(free_gpu_memory_fraction=BUILD_KV_CACHE_FRACTION),
    }
    if plan.quantization == "fp8":
        assert calibration is not None
        # kv_cache_quant_algo unset: the KV cache stays 16-bit
        kwargs["quant_config"] = api.QuantConfig(quant_algo=api.QuantAlgo.FP8)
        kwargs["calib_config"] = api.CalibConfig(calib_dataset=calibration["dataset"],
                                                 calib_batches=calibration["samples"],
                                                 calib_max_seq_length=calibration["max_seq_length"])
    return kwargs


def build_trtllm_engine(cfg: LyreConfig, plan: BuildPlan, progress: bool = True,
                        api: SimpleNamespace | None = None, device: str = "cuda") -> Manifest:
    """Run the build. NOT YET RUN ON A GPU BY THIS PROJECT (see the module doc); ``api`` stands in
    for :func:`load_llmapi` and ``device`` (where the calibration audio is generated) is "cpu" in tests."""
    api = api or load_llmapi()
    say = print if progress else log.info
    say("[1/5] resolving the checkpoint")
    model_dir, revision = resolve_checkpoint(cfg)
    say(f"      {model_dir} (revision {revision})")
    say("[2/5] hashing it")
    files = [model_dir / "config.json", *checkpoint.safetensors_files(model_dir)]
    digest = hash_files(files, progress=progress)

    b = cfg.build
    if plan.dtype == "auto":  # (the checkpoint was not downloaded when the plan was made)
        plan.dtype = checkpoint_dtype(model_dir)
    work = plan.engine_dir.parent / f".{plan.engine_dir.name}.building"
    shutil.rmtree(work, ignore_errors=True)
    calibration: dict[str, Any] = {"samples": 0}
    source = model_dir
    if plan.quantization == "fp8":
        say(f"[3/5] building the calibration set ({b.calibration_samples} prompts, {plan.dtype})")
        calibration = write_calibration_set(work / "calibration", cfg, model_dir, device, progress)
        # the checkpoint as TensorRT-LLM's calibration loader must tokenize it: the records as they are
        source = Path(calibration.pop("checkpoint"))
    else:
        say(f"[3/5] no calibration ({plan.quantization} weights)")

    say(f"[4/5] quantizing and building with TensorRT-LLM {api.version} (this takes minutes)")
    llm = api.LLM(**llm_arguments(api, cfg, plan, source, calibration if plan.quantization == "fp8" else None))
    try:
        say(f"[5/5] saving to {plan.engine_dir}")
        if plan.engine_dir.exists():
            shutil.rmtree(plan.engine_dir)
        llm.save(str(plan.engine_dir))
    finally:
        llm.shutdown()
    for name in STAGED_TOKENIZER_FILES:  # a tokenizer saved beside the engine is the checkpoint's, not the staged one
        if (plan.engine_dir / name).is_file() and (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, plan.engine_dir / name)
    shutil.rmtree(work, ignore_errors=True)
    env = plan.environment
    manifest = Manifest(
        model_source=plan.model, model_revision=revision, model_sha256=digest,
        tensorrt_llm_version=env.tensorrt_llm_version or api.version,
        tensorrt_version=env.tensorrt_version or "", gpu_name=env.gpu_name or "",
        compute_capability=list(env.compute_capability or ()), quantization=plan.quantization,
        kv_cache_dtype=plan.dtype, build={**plan.build, "model": model_summary(model_dir)},
        calibration=calibration, created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        lyre_version=__version__,
    )
    manifest.write(plan.engine_dir)
    return manifest


# --------------------------------------------------------------------------------------------
# --backend torch: prepare the checkpoint for the PyTorch backend


def verify_llama_checkpoint(model_dir: Path) -> checkpoint.LlamaConfig:
    """config.json, tokenizer and every weight's name and shape (read from the safetensors headers)."""
    from safetensors import safe_open

    config = checkpoint.read_llama_config(model_dir)
    checkpoint.load_tokenizer(model_dir)
    shapes: dict[str, tuple[int, ...]] = {}
    for f in checkpoint.safetensors_files(model_dir):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                shapes[name] = tuple(st.get_slice(name).get_shape())
    checkpoint.check_weight_shapes(shapes, config, str(model_dir))
    return config


def prepare_torch(cfg: LyreConfig, say: Callable[[str], None] = print) -> tuple[Path, Path]:
    """Download (if needed) and verify the model and codec for the PyTorch backend."""
    say("[1/3] the model")
    model_dir, revision = resolve_checkpoint(cfg)
    say(f"      {model_dir} (revision {revision})")
    say("[2/3] the codec")
    if cfg.codec.path is not None:
        snac_dir = Path(cfg.codec.path)
        if not snac_dir.is_dir():
            raise BuildError(f"codec.path {snac_dir} is not a directory")
    else:
        snac_dir = checkpoint.find_cached(cfg.codec.hf_id, "snac", cfg.codec.revision) or checkpoint.download(
            cfg.codec.hf_id, "snac", cfg.codec.revision)
    say(f"      {snac_dir}")
    say("[3/3] verifying")
    config = verify_llama_checkpoint(model_dir)
    checkpoint.load_snac(snac_dir, "cpu")
    say(f"      model: {config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab {config.vocab_size}; "
        f"tokenizer and SNAC load")
    return model_dir, snac_dir
