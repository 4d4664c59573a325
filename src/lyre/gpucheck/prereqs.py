"""What a machine needs before TensorRT-LLM 1.2.1 installs and runs: an NVIDIA driver for CUDA 13,
the CUDA 13 toolkit with ``CUDA_HOME``, Open MPI (its library and ``mpirun``) and a Python it has
wheels for. Each check says what was found and, when it fails, what to do.

Standard library only: ``setup.sh`` runs it with the system Python before ``.venv`` exists
(``python -m lyre.gpucheck.prereqs``, exit 1 naming every failed check), and the environment stage
of ``python -m lyre.gpucheck`` reports the same checks.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TRT_VERSION = "1.2.1"
CUDA_MAJOR = 13
MIN_DRIVER = 580  # the first driver branch for CUDA 13
PYTHONS = ("3.10", "3.12")  # TensorRT-LLM 1.2.1's wheels
PYTORCH_ROUTE = "or LYRE_TRT=off ./setup.sh for the PyTorch backend"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    found: str  # what this machine has
    fix: str = ""  # what to do when not ok


def _run(argv: list[str]) -> str | None:
    """stdout of ``argv``, or None when it is missing or fails."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def check_gpu() -> Check:
    listing = _run(["nvidia-smi", "-L"])
    gpus = [line.split(":", 1)[1].split("(UUID")[0].strip() for line in (listing or "").splitlines()
            if line.startswith("GPU ")]
    if not gpus:
        return Check("NVIDIA GPU", False, "nvidia-smi sees no GPU" if listing is not None else "no nvidia-smi",
                     "run this on a machine with an NVIDIA GPU and its driver")
    return Check("NVIDIA GPU", True, ", ".join(f"{i}: {name}" for i, name in enumerate(gpus)))


def check_driver() -> Check:
    header = _run(["nvidia-smi"]) or ""
    driver = re.search(r"Driver Version: *([0-9]+)(\.[0-9.]+)?", header)
    cuda = re.search(r"CUDA Version: *([0-9]+)\.([0-9]+)", header)
    if not driver or not cuda:
        return Check("driver", False, "nvidia-smi does not report its driver and CUDA versions",
                     f"check the NVIDIA driver, {PYTORCH_ROUTE}")
    found = f"driver {driver.group(1)}{driver.group(2) or ''}, supports CUDA {cuda.group(1)}.{cuda.group(2)}"
    if int(cuda.group(1)) < CUDA_MAJOR or int(driver.group(1)) < MIN_DRIVER:
        return Check("driver", False, found,
                     f"TensorRT-LLM {TRT_VERSION} needs CUDA {CUDA_MAJOR}; this driver supports CUDA "
                     f"{cuda.group(1)}.{cuda.group(2)}. Install an NVIDIA driver for CUDA {CUDA_MAJOR} "
                     f"({MIN_DRIVER} or newer), {PYTORCH_ROUTE}")
    return Check("driver", True, found)


def check_toolkit() -> Check:
    home = os.environ.get("CUDA_HOME")
    where = Path(home) if home else Path("/usr/local/cuda")
    nvcc = where / "bin" / "nvcc"
    version = _run([str(nvcc), "--version"]) if nvcc.is_file() else None
    release = re.search(r"release ([0-9]+)\.([0-9]+)", version or "")
    fix = (f"install the CUDA {CUDA_MAJOR} toolkit (https://developer.nvidia.com/cuda-downloads) and "
           f"export CUDA_HOME=/usr/local/cuda-{CUDA_MAJOR}.x, {PYTORCH_ROUTE}")
    if release is None:
        said = f"CUDA_HOME={home}" if home else "CUDA_HOME is unset"
        return Check("CUDA toolkit", False, f"{said} and {where} has no working bin/nvcc", fix)
    found = f"CUDA {release.group(1)}.{release.group(2)} at {where}" + ("" if home else " (CUDA_HOME unset)")
    if int(release.group(1)) != CUDA_MAJOR:
        return Check("CUDA toolkit", False, found, f"TensorRT-LLM {TRT_VERSION} is built for CUDA {CUDA_MAJOR}: {fix}")
    if not home:
        return Check("CUDA toolkit", False, found, f"export CUDA_HOME={where} (TensorRT-LLM reads it)")
    return Check("CUDA toolkit", True, found)


MPI_DIRS = ("/opt/hpcx/ompi/lib",)  # NVIDIA's containers: HPC-X's Open MPI, found through LD_LIBRARY_PATH


def _has_libmpi() -> bool:
    libs = _run(["ldconfig", "-p"]) or _run(["/sbin/ldconfig", "-p"]) or ""
    if "libmpi.so" in libs:
        return True
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(MPI_DIRS)
    return any(any(Path(d).glob("libmpi.so*")) for d in dirs if Path(d).is_dir())


def check_mpi() -> Check:
    has_lib, mpirun = _has_libmpi(), shutil.which("mpirun")
    found = f"libmpi.so {'found' if has_lib else 'missing'}, mpirun {mpirun or 'missing'}"
    if has_lib and mpirun:
        return Check("MPI", True, found)
    missing = [p for p, gone in (("libopenmpi-dev", not has_lib), ("openmpi-bin", not mpirun)) if gone]
    return Check("MPI", False, found, f"TensorRT-LLM {TRT_VERSION} needs MPI: sudo apt-get install -y "
                                      f"{' '.join(missing)} (then again), {PYTORCH_ROUTE}")


def check_python(version: str | None = None) -> Check:
    v = version or "{}.{}".format(*sys.version_info[:2])
    if v in PYTHONS:
        return Check("Python", True, v)
    return Check("Python", False, v, f"TensorRT-LLM {TRT_VERSION} has wheels for Python {' and '.join(PYTHONS)} only: "
                                     f"PYTHON=python3.12 ./setup.sh, {PYTORCH_ROUTE}")


def machine_checks() -> list[Check]:
    """Every check, in order (all of them run: a user sees everything missing at once)."""
    gpu = check_gpu()
    if not gpu.ok:
        return [gpu]
    return [gpu, check_driver(), check_toolkit(), check_mpi(), check_python()]


def describe(checks: list[Check]) -> str:
    return "\n".join(f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.found}" + ("" if c.ok else f"\n       -> {c.fix}")
                     for c in checks)


def main() -> int:
    checks = machine_checks()
    print(f"TensorRT-LLM {TRT_VERSION} prerequisites:\n{describe(checks)}", file=sys.stderr)
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
