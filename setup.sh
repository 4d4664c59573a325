#!/usr/bin/env bash
# Sets up Lyre from a clean clone: creates .venv, installs the project with its dev extra (a CPU
# build of torch where no NVIDIA GPU is present; the trt extra, TensorRT-LLM 1.2 from NVIDIA's
# package index, where nvidia-smi sees a GPU and the Python version has its wheels: 3.10 or 3.12),
# then prepares the default model (the demo checkpoint when no real weights are configured or cached).
#
# Idempotent: a second run with nothing changed only checks and takes seconds.
# Environment:
#   PYTHON            interpreter to build .venv with (default: python3; must be 3.10-3.12)
#   LYRE_TORCH_SPEC   torch requirement on CPU-only machines (default: torch==2.13.0)
#   LYRE_TORCH_INDEX  extra package index holding CPU torch wheels, if your default index has none
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

say() { echo "setup.sh: $*"; }
fail() { echo "setup.sh: error: $*" >&2; exit 1; }

PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null 2>&1 || fail "$PYTHON not found; install Python 3.10-3.12 or set PYTHON=/path/to/python"
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || fail "$PYTHON does not run"
case "$pyver" in
  3.10|3.11|3.12) ;;
  *) fail "Python $pyver is not supported (3.10-3.12); set PYTHON to a supported interpreter" ;;
esac

gpu=no
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "GPU"; then
  gpu=yes
fi
extras=dev
if [ "$gpu" = yes ]; then
  case "$pyver" in
    3.10|3.12) extras=dev,trt ;;
    *) say "an NVIDIA GPU is present but TensorRT-LLM 1.2 has no wheels for Python $pyver (3.10 and 3.12 only):" \
         "installing without the trt extra; the PyTorch backend will be used" ;;
  esac
fi
torch_spec=${LYRE_TORCH_SPEC:-torch==2.13.0}

log=.venv/setup.log
stamp_file=.venv/.lyre-setup-stamp
stamp=$(cat pyproject.toml setup.sh | sha256sum | cut -c1-16)-$pyver-$gpu-$extras-$torch_spec-${LYRE_TORCH_INDEX:-}

pip_install() {
  # Quiet pip, with its whole log kept in .venv/setup.log and shown on failure.
  if ! .venv/bin/python -m pip install --disable-pip-version-check "$@" >>"$log" 2>&1; then
    echo "---- last lines of $log ----" >&2
    tail -n 30 "$log" >&2
    return 1
  fi
}

if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] && .venv/bin/python -c "import lyre, torch, snac" 2>/dev/null; then
  say "dependencies up to date (.venv)"
else
  if [ ! -x .venv/bin/python ]; then
    say "creating .venv with Python $pyver"
    "$PYTHON" -m venv .venv || fail "could not create .venv (on Debian/Ubuntu: apt-get install python3-venv)"
  fi
  : >"$log"
  if [ "$gpu" = no ]; then
    say "no NVIDIA GPU: installing the CPU build of torch ($torch_spec); the TensorRT-LLM backend (trt extra) is skipped"
    index_args=()
    [ -n "${LYRE_TORCH_INDEX:-}" ] && index_args=(--extra-index-url "$LYRE_TORCH_INDEX")
    pip_install "${index_args[@]}" "$torch_spec" || fail "could not install $torch_spec; set LYRE_TORCH_SPEC or LYRE_TORCH_INDEX"
  else
    say "NVIDIA GPU found: torch comes with the project's requirements ($extras)"
  fi
  extra_index=()
  if [ "$extras" = dev,trt ]; then
    # TensorRT-LLM's wheels live on NVIDIA's index (PyPI has only a stub that redirects there).
    say "installing the trt extra: TensorRT-LLM 1.2 from https://pypi.nvidia.com (several GB; needs MPI: libopenmpi-dev)"
    extra_index=(--extra-index-url https://pypi.nvidia.com)
  fi
  say "installing lyre with extras [$extras] (log: $log)"
  pip_install "${extra_index[@]}" -e ".[$extras]" || fail "could not install the project's dependencies"
  if [ "$extras" = dev,trt ]; then
    if trt_version=$(.venv/bin/python -c "import tensorrt_llm; print(tensorrt_llm.__version__)" 2>>"$log"); then
      say "TensorRT-LLM $trt_version installed: build an engine with python build_engine.py (model.backend auto then uses it)"
    else
      say "warning: TensorRT-LLM installed but does not import (see $log; often a missing libmpi: apt-get install" \
          "libopenmpi-dev): the server will use the PyTorch backend"
    fi
  fi
  echo "$stamp" >"$stamp_file"
fi

# gRPC stubs from protos/ (generated, not committed); regenerated when a .proto is newer.
proto=protos/lyre/v1/tts.proto
stub=src/lyre/v1/tts_pb2_grpc.py
if [ ! -f "$stub" ] || [ "$proto" -nt "$stub" ]; then
  say "generating gRPC stubs from $proto"
  mkdir -p src/lyre/v1
  .venv/bin/python -m grpc_tools.protoc -Iprotos --python_out=src --pyi_out=src --grpc_python_out=src "$proto" \
    || fail "could not generate the gRPC stubs"
fi

say "preparing the default model"
.venv/bin/python -m lyre.checkpoint resolve || fail "could not prepare the default model"
say "preparing the codec (the first time: exports the streaming decoder for its runtime, ~30 s)"
.venv/bin/python -m lyre.codec prepare 2>&1 | tail -n 1 || fail "could not prepare the codec"
say "done"
