#!/usr/bin/env bash
# Sets up Lyre from a clean clone: creates .venv, installs the project with its dev extra, then
# prepares the default model (the demo checkpoint when no real weights are configured or cached).
#
# Where no NVIDIA GPU is present: a CPU build of torch, no TensorRT-LLM.
# Where nvidia-smi sees a GPU (and Python is 3.10 or 3.12, the versions TensorRT-LLM 1.2.1 has
# wheels for): NVIDIA's documented pip route for TensorRT-LLM 1.2.1. It checks the driver (CUDA 13,
# 580 or newer), the CUDA 13 toolkit and CUDA_HOME, and Open MPI (libopenmpi-dev, openmpi-bin),
# stopping with what to install for each one missing; installs torch 2.9.1 built for CUDA 13.0 from
# PyTorch's cu130 index, then tensorrt-llm==1.2.1 alone (from https://pypi.nvidia.com), then the
# project with its dev and trt extras constrained to every version TensorRT-LLM installed.
# pyproject.toml's ranges intersect TensorRT-LLM 1.2.1's published requirements
# (tests/deploy/test_install.py checks them against src/lyre/gpucheck/tensorrt-llm-1.2.1-requires.json).
#
# Idempotent: a second run with nothing changed only checks and takes seconds.
# --with-test-services: also install the OS packages the test suite needs when missing (Debian's
# postgresql, haproxy and chromium, with apt-get); the README's test command passes it.
# Environment:
#   PYTHON               interpreter to build .venv with (default: python3; must be 3.10-3.12)
#   LYRE_TORCH_SPEC      torch requirement on CPU-only machines (default: torch==2.13.0)
#   LYRE_TORCH_INDEX     extra package index holding CPU torch wheels, if your default index has none
#   LYRE_TRT             auto (default): TensorRT-LLM where a GPU is seen; off: never (a GPU machine then
#                        gets torch from the default index and the PyTorch backend)
#   LYRE_GPU_TORCH_SPEC  torch for TensorRT-LLM (default: torch==2.9.1, inside tensorrt-llm 1.2.1's range)
#   LYRE_GPU_TORCH_INDEX its index (default: https://download.pytorch.org/whl/cu130)
#   LYRE_INSTALLER       uv (default): the project's dependencies are installed with uv (put into .venv
#                        with pip first; ~10x faster than pip), falling back to pip when uv fails; pip:
#                        pip only. uv does not read pip.conf: on a machine whose package index is set
#                        there, set UV_INDEX_URL too, or LYRE_INSTALLER=pip. torch itself (and the whole
#                        TensorRT-LLM route) always goes through pip, which honours pip.conf.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

say() { echo "setup.sh: $*"; }
fail() { echo "setup.sh: error: $*" >&2; exit 1; }

with_services=no
for arg in "$@"; do
  case "$arg" in
    --with-test-services) with_services=yes ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) fail "unknown option $arg (the only option is --with-test-services)" ;;
  esac
done
case "${LYRE_INSTALLER:-uv}" in uv|pip) ;; *) fail "LYRE_INSTALLER must be uv or pip, not '${LYRE_INSTALLER}'" ;; esac

# The test suite's OS packages: PostgreSQL (a throwaway cluster per run: the registry and audit trail
# on a real server), HAProxy (replicas behind a real load balancer) and Chromium (the playground page
# in a real headless browser, driven by Playwright: Debian's build, never one Playwright downloads).
# Installed when missing.
if [ "$with_services" = yes ]; then
  need=()
  if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then need+=(postgresql); fi
  if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then need+=(haproxy); fi
  if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then need+=(chromium); fi
  if [ ${#need[@]} -gt 0 ]; then
    say "the tests need ${need[*]} (Debian packages): installing them with apt-get"
    sudo=()
    if [ "$(id -u)" != 0 ]; then
      command -v sudo >/dev/null 2>&1 || fail "installing ${need[*]} needs root: run apt-get install ${need[*]} as root, then ./setup.sh again"
      sudo=(sudo)
    fi
    command -v apt-get >/dev/null 2>&1 || fail "no apt-get here: install ${need[*]} with your package manager, then ./setup.sh again"
    { "${sudo[@]}" apt-get update -qq && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"; } \
      >/tmp/lyre-apt.log 2>&1 || { tail -n 20 /tmp/lyre-apt.log >&2; fail "could not install ${need[*]} (log: /tmp/lyre-apt.log)"; }
  fi
fi

PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null 2>&1 || fail "$PYTHON not found; install Python 3.10-3.12 or set PYTHON=/path/to/python"
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || fail "$PYTHON does not run"
case "$pyver" in
  3.10|3.11|3.12) ;;
  *) fail "Python $pyver is not supported (3.10-3.12); set PYTHON to a supported interpreter" ;;
esac

TRT_VERSION=1.2.1
TRT_CUDA_MAJOR=13
gpu_torch_spec=${LYRE_GPU_TORCH_SPEC:-torch==2.9.1}
gpu_torch_index=${LYRE_GPU_TORCH_INDEX:-https://download.pytorch.org/whl/cu130}

gpu=no
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "GPU"; then
  gpu=yes
fi
extras=dev
if [ "$gpu" = yes ] && [ "${LYRE_TRT:-auto}" != off ]; then
  case "$pyver" in
    3.10|3.12) extras=dev,trt ;;
    *) say "an NVIDIA GPU is present but TensorRT-LLM $TRT_VERSION has no wheels for Python $pyver (3.10 and 3.12 only):" \
         "installing without the trt extra; the PyTorch backend will be used (PYTHON=python3.12 ./setup.sh for TensorRT-LLM)" ;;
  esac
fi
if [ "$extras" = dev,trt ]; then
  # NVIDIA's prerequisites for the TensorRT-LLM $TRT_VERSION wheels, checked before anything is installed:
  # a driver for CUDA $TRT_CUDA_MAJOR, the CUDA $TRT_CUDA_MAJOR toolkit with CUDA_HOME, Open MPI (library and mpirun).
  # (lyre.gpucheck.prereqs: standard library only; it prints every check and what to do for each failed one)
  PYTHONPATH=src "$PYTHON" -m lyre.gpucheck.prereqs \
    || fail "this GPU machine is not ready for TensorRT-LLM $TRT_VERSION: see the checks above"
fi
torch_spec=${LYRE_TORCH_SPEC:-torch==2.13.0}

log=.venv/setup.log
stamp_file=.venv/.lyre-setup-stamp
stamp=$(cat pyproject.toml setup.sh | sha256sum | cut -c1-16)-$pyver-$gpu-$extras-$torch_spec-${LYRE_TORCH_INDEX:-}-$gpu_torch_spec-$gpu_torch_index

pip_install() {
  # Quiet pip, with its whole log kept in .venv/setup.log and shown on failure.
  if ! .venv/bin/python -m pip install --disable-pip-version-check "$@" >>"$log" 2>&1; then
    echo "---- last lines of $log ----" >&2
    tail -n 30 "$log" >&2
    return 1
  fi
}

deps_install() {
  # The project's own install: uv when it is there and LYRE_INSTALLER allows, pip otherwise or when
  # uv fails (a machine whose index only pip is configured for).
  if [ "${LYRE_INSTALLER:-uv}" = uv ] && { [ -x .venv/bin/uv ] || pip_install "uv>=0.5"; }; then
    if .venv/bin/uv pip install --python .venv/bin/python "$@" >>"$log" 2>&1; then
      return 0
    fi
    say "uv could not install the dependencies (see $log): trying pip"
  fi
  pip_install "$@"
}

if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] && .venv/bin/python -c "import lyre, torch, snac" 2>/dev/null; then
  say "dependencies up to date (.venv)"
else
  if [ ! -x .venv/bin/python ]; then
    say "creating .venv with Python $pyver"
    "$PYTHON" -m venv .venv || fail "could not create .venv (on Debian/Ubuntu: apt-get install python3-venv)"
  fi
  : >"$log"
  install_args=()
  if [ "$extras" = dev,trt ]; then
    say "NVIDIA GPU found: NVIDIA's pip route for TensorRT-LLM $TRT_VERSION (several GB)"
    say "installing $gpu_torch_spec from $gpu_torch_index"
    pip_install "$gpu_torch_spec" torchvision --index-url "$gpu_torch_index" \
      || fail "could not install $gpu_torch_spec from $gpu_torch_index (see $log)"
    # TensorRT-LLM alone first (its wheels live on NVIDIA's index; torch stays the CUDA 13 build just
    # installed): its hard pins (numpy<2, transformers, datasets, setuptools<80, h5py, triton...) then
    # bind everything else, which is installed constrained to what it brought (one resolve of the
    # whole .[dev,trt] can pick versions those pins refuse).
    .venv/bin/python -c "import torch; print('torch==' + torch.__version__)" >.venv/trt-constraints.txt
    say "installing tensorrt-llm==$TRT_VERSION"
    pip_install --extra-index-url https://pypi.nvidia.com -c .venv/trt-constraints.txt "tensorrt-llm==$TRT_VERSION" \
      || fail "could not install tensorrt-llm==$TRT_VERSION (see $log)"
    .venv/bin/python -m pip freeze --exclude-editable | grep -E '^[A-Za-z0-9_.-]+==' >.venv/trt-constraints.txt
    install_args=(--extra-index-url https://pypi.nvidia.com -c .venv/trt-constraints.txt)
  elif [ "$gpu" = no ]; then
    say "no NVIDIA GPU: installing the CPU build of torch ($torch_spec); the TensorRT-LLM backend (trt extra) is skipped"
    index_args=()
    [ -n "${LYRE_TORCH_INDEX:-}" ] && index_args=(--extra-index-url "$LYRE_TORCH_INDEX")
    pip_install "${index_args[@]}" "$torch_spec" || fail "could not install $torch_spec; set LYRE_TORCH_SPEC or LYRE_TORCH_INDEX"
  else
    say "NVIDIA GPU found, without TensorRT-LLM: torch comes with the project's requirements ($extras)"
  fi
  say "installing lyre with extras [$extras] (log: $log)"
  if [ "$extras" = dev,trt ]; then  # NVIDIA's documented route is pip's (its index order and constraints)
    pip_install "${install_args[@]}" -e ".[$extras]" || fail "could not install the project's dependencies within" \
      "TensorRT-LLM $TRT_VERSION's pins (every package it installed is held at its version: .venv/trt-constraints.txt)"
  else
    deps_install -e ".[$extras]" || fail "could not install the project's dependencies"
  fi
  # The Qwen3-TTS reference implementation the tests hold Lyre's to (tests/support/qwen_reference.py):
  # without its dependencies, which pin gradio, accelerate and torchaudio; what it imports is in .[dev].
  deps_install --no-deps "qwen-tts==0.1.1" || fail "could not install qwen-tts (the tests' Qwen3-TTS reference)"
  if [ "$extras" = dev,trt ]; then
    if trt_version=$(.venv/bin/python -c "import tensorrt_llm; print(tensorrt_llm.__version__)" 2>>"$log"); then
      say "TensorRT-LLM $trt_version installed: build an engine with python build_engine.py (model.backend auto then uses it)"
    else
      say "warning: TensorRT-LLM installed but does not import (see the end of $log): the server will use the" \
          "PyTorch backend"
    fi
  fi
  echo "$stamp" >"$stamp_file"
fi

# gRPC stubs from protos/ (generated, not committed); regenerated when the .proto or grpcio-tools
# changes (the generated code checks that the protobuf runtime is at least as new as its generator).
proto=protos/lyre/v1/tts.proto
stub=src/lyre/v1/tts_pb2_grpc.py
stub_stamp=src/lyre/v1/.generated-by
stub_id="$(sha256sum "$proto" | cut -c1-16) grpcio-tools $(.venv/bin/python -c 'from importlib.metadata import version; print(version("grpcio-tools"))')"
if [ ! -f "$stub" ] || [ "$(cat "$stub_stamp" 2>/dev/null)" != "$stub_id" ]; then
  say "generating gRPC stubs from $proto"
  mkdir -p src/lyre/v1
  .venv/bin/python -m grpc_tools.protoc -Iprotos --python_out=src --pyi_out=src --grpc_python_out=src "$proto" \
    || fail "could not generate the gRPC stubs"
  echo "$stub_id" >"$stub_stamp"
fi

say "preparing the default model"
.venv/bin/lyre checkpoint resolve || fail "could not prepare the default model"
say "preparing the codec (the first time: exports the streaming decoder for its runtime, ~30 s)"
.venv/bin/lyre codec prepare 2>&1 | tail -n 1 || fail "could not prepare the codec"
say "done"
