"""What the acceptance run's stages share: the parts that need a GPU (:class:`Kit`: the tests give
fakes), the run's directories and the engines built so far (:class:`Context`), and one way to run
a batch of requests through either engine to the end (:func:`generate`)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from lyre.config import LyreConfig, load_config
from lyre.engine.backend import Environment, Manifest, probe_environment
from lyre.engine.base import GenerationRequest, TokenDelta, TokenEngine
from lyre.engine.trtllm.engine import load_bindings
from lyre.gpucheck import prereqs
from lyre.gpucheck.report import StageFailed
from lyre.model import demo
from lyre.tools.build import load_llmapi

TIMED_OUT = 124  # run_logged's status for a command stopped at its time limit (as timeout(1) says it)


def run_logged(argv: list[str], log: Path, cwd: Path, timeout_s: float, grace_s: float = 30.0) -> int:
    """Run ``argv`` with its output in ``log``; its exit status, or :data:`TIMED_OUT` when it ran past
    ``timeout_s``. Whatever way this returns (its end, its time limit, an exception here), every
    process it started is gone: the benchmark's servers outlive it when it dies first (a server
    drains on SIGTERM), so its whole process group gets SIGTERM, then SIGKILL after ``grace_s``."""
    with log.open("w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return TIMED_OUT
        finally:
            stop_group(proc, grace_s)


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to ``proc``'s process group (its leader), SIGKILL to whatever of it is left after ``grace_s``."""
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.1)  # (the leader reaped: a group of it alone is then empty)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def cuda_device() -> dict[str, Any] | None:
    """The first CUDA device as torch sees it (None: none)."""
    import torch

    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "capability": [p.major, p.minor], "memory_gib": round(p.total_memory / 2**30, 1)}


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass
class Kit:
    """What the run drives that needs a GPU. Tests replace these with fakes (no GPU there)."""

    machine_checks: Callable[[], list[prereqs.Check]] = prereqs.machine_checks
    probe: Callable[[], Environment] = probe_environment
    bindings: Callable[[], ModuleType] = load_bindings
    llmapi: Callable[[], SimpleNamespace] = load_llmapi
    gpu: Callable[[], dict[str, Any] | None] = cuda_device
    installed: Callable[[str], str | None] = installed_version
    device: str = "cuda"
    run: Callable[[list[str], Path, Path, float], int] = run_logged


@dataclass
class Context:
    out: Path  # the report and the files it points to
    work: Path  # checkpoints and engines
    backend: str  # trtllm | torch
    kit: Kit
    calibration_samples: int = 32
    shapes: tuple[str, ...] = ("tiny", "small")  # demo shapes built in FP8; the last one is the scaling stage's
    levels: str = "1,8,32,64"
    max_tokens: int | None = None  # the scaling stage's tokens per request (None: stages.SCALING_TOKENS)
    timeout_s: float = 600.0  # one stage's requests, at most
    scaling_timeout_s: float = 3600.0  # the scaling benchmark, at most
    env: Environment | None = None
    engines: dict[str, tuple[Path, Manifest]] = field(default_factory=dict)  # name -> (engine dir, manifest)
    checkpoints: Path | None = None  # where the demo checkpoints are written (default: work; they are only read)

    def checkpoint(self, shape: str) -> Path:
        """The demo checkpoint in ``shape`` (random weights, Orpheus's vocabulary and layout)."""
        return demo.ensure_demo((self.checkpoints or self.work) / f"checkpoint-{shape}", shape=shape)

    def config(self, shape: str, quantization: str = "fp8", **overrides: Any) -> LyreConfig:
        root = self.checkpoint(shape)
        return load_config(None, {
            "model.path": str(root / "llama"), "codec.path": str(root / "snac"),
            "build.engine_dir": str(self.work / "engines" / f"{shape}-{quantization}"),
            "build.quantization": quantization, "build.calibration_samples": self.calibration_samples,
            "build.max_batch_size": 64, "build.max_seq_len": 2048, "build.max_input_len": 1536,
            "kv_cache.max_seq_len": 2048, "data_dir": str(self.work / "data"), **overrides})


@dataclass
class Outcome:
    tokens: list[int] = field(default_factory=list)
    finish: str | None = None
    error: str | None = None
    logits: list[Any] = field(default_factory=list)  # recorded rows (torch engine, record_logits)
    logits_ids: list[Any] = field(default_factory=list)


def generate(engine: TokenEngine, requests: list[GenerationRequest], timeout_s: float) -> dict[str, Outcome]:
    """Every request through ``engine`` to its end (added as capacity allows); StageFailed past ``timeout_s``."""
    out = {r.request_id: Outcome() for r in requests}
    waiting = list(requests)
    deadline = time.monotonic() + timeout_s
    while waiting or engine.has_work():
        while waiting and engine.add(waiting[0]):
            waiting.pop(0)
        for d in engine.step():
            _take(out[d.request_id], d)
        if time.monotonic() > deadline:
            done = sum(o.finish is not None for o in out.values())
            raise StageFailed(f"the engine did not finish {len(requests)} requests in {timeout_s:.0f} s "
                              f"({done} finished)")
    return out


def _take(o: Outcome, d: TokenDelta) -> None:
    o.tokens.extend(d.token_ids)
    if d.logits is not None:
        o.logits.extend(d.logits)
        o.logits_ids.extend(d.logits_ids)
    if d.finished:
        o.finish, o.error = d.finish_reason, d.error
