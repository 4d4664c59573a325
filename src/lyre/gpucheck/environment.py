"""Stage 1 of the acceptance run: the machine (driver, CUDA toolkit, MPI: :mod:`lyre.gpucheck.prereqs`),
the GPU as torch sees it, and the installed packages against what TensorRT-LLM 1.2.1 requires
(its published requirements, ``tensorrt-llm-1.2.1-requires.json`` beside this file) and what Lyre
requires. On a machine without a GPU it fails here, saying so."""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from lyre.gpucheck.context import Kit
from lyre.gpucheck.prereqs import describe
from lyre.gpucheck.report import StageFailed

REQUIRES = Path(__file__).parent / "tensorrt-llm-1.2.1-requires.json"
TORCH_BACKEND_CHECKS = ("NVIDIA GPU",)  # the PyTorch backend needs no CUDA toolkit or MPI


def pin_violations(requirements: list[str], installed: Callable[[str], str | None]) -> list[str]:
    """Each installed package whose version a requirement (that applies here) refuses."""
    env = default_environment()
    out = []
    for line in requirements:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        version = installed(req.name)
        if version is None or not req.specifier:
            continue
        try:
            ok = req.specifier.contains(Version(version), prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            out.append(f"{req.name} {version} is installed; the requirement is {req.name}{req.specifier}")
    return out


def lyre_requirements() -> list[str]:
    """Lyre's own runtime requirements (extras left out), as installed; none when Lyre runs from its
    source tree without being installed."""
    try:
        return [r for r in importlib.metadata.requires("lyre") or [] if "extra ==" not in r]
    except importlib.metadata.PackageNotFoundError:
        return []


def stage_environment(kit: Kit, backend: str) -> tuple[str, list[str], dict[str, Any]]:
    """(summary, details, data); raises StageFailed naming every problem."""
    import torch

    machine_checks = kit.machine_checks()
    checks = machine_checks if backend == "trtllm" else [c for c in machine_checks if c.name in TORCH_BACKEND_CHECKS]
    problems = [f"{c.name}: {c.fix}" for c in checks if not c.ok]
    details = ["Machine:", "", "```", describe(checks), "```", ""]
    data: dict[str, Any] = {"checks": [c.__dict__ for c in checks], "torch": torch.__version__,
                            "torch_cuda": torch.version.cuda}
    device = kit.gpu()
    gpu = ""
    if device is not None:
        gpu = f"{device['name']}, compute capability {'.'.join(map(str, device['capability']))}, " \
              f"{device['memory_gib']} GiB"
        data["gpu"] = device
        details.append(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees {gpu}.")
    elif any(c.name == "NVIDIA GPU" and c.ok for c in machine_checks):
        problems.append(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU although nvidia-smi does: "
                        f"a CPU build of torch, or one built for a CUDA this driver does not support")
    if not any(c.name == "NVIDIA GPU" and c.ok for c in machine_checks):
        raise StageFailed("this machine has no NVIDIA GPU: run python -m lyre.gpucheck on the GPU machine to "
                          "be brought up (on a CPU machine Lyre serves with the PyTorch backend)", details, data)
    ours = lyre_requirements()
    if not ours:
        details.append("Lyre runs from its source tree, not installed: its own requirements were not checked.")
    violations = pin_violations(ours, kit.installed)
    if backend == "trtllm":
        env = kit.probe()
        data["tensorrt_llm"], data["tensorrt"] = env.tensorrt_llm_version, env.tensorrt_version
        if env.tensorrt_llm_version is None:
            problems.append(env.import_error or "TensorRT-LLM is not installed")
        else:
            details.append(f"TensorRT-LLM {env.tensorrt_llm_version} imports (TensorRT {env.tensorrt_version}).")
            if not env.supports_fp8:
                details.append("This GPU has no FP8 (compute capability < 8.9): the builds fall back to 16-bit.")
        spec = json.loads(REQUIRES.read_text())
        if env.tensorrt_llm_version not in (None, spec["version"]):
            problems.append(f"TensorRT-LLM {env.tensorrt_llm_version} is installed; Lyre is held to {spec['version']}")
        violations += pin_violations(spec["requires_dist"], kit.installed)
    problems += [f"package versions: {v}" for v in violations]
    data["problems"] = problems
    if problems:
        details += ["", "Problems:", "", *[f"- {p}" for p in problems]]
        raise StageFailed(f"{len(problems)} problem(s): {problems[0]}", details, data)
    checked = (["TensorRT-LLM's pins"] if backend == "trtllm" else []) + (["Lyre's requirements"] if ours else [])
    return f"{gpu}; " + (f"every package inside {' and '.join(checked)}" if checked else "no package pins checked"), \
        details, data


