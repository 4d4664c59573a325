# Lyre on an NVIDIA GPU with TensorRT-LLM 1.2.1: NVIDIA's release container, where TensorRT-LLM,
# TensorRT, CUDA 13, MPI and torch are already installed; this adds only Lyre (nothing the
# container ships is upgraded or replaced: its own packages are the install's constraints).
#
# NOT YET BUILT OR RUN BY THIS PROJECT (no GPU and no image registry on its machines);
# tests/test_docker.py checks this file statically. The container (Ubuntu 24.04, Python 3.12, on
# nvcr.io/nvidia/pytorch:25.12-py3) runs as root and marks its Python externally managed, hence
# PIP_BREAK_SYSTEM_PACKAGES; the image switches to an unprivileged user once Lyre is installed.
#
#   docker build -f docker/gpu.Dockerfile -t lyre:gpu .
#
# 1. Build the engine once, offline, as its own step (it writes engines/ and the Hugging Face
#    cache under models/; --ipc=host and the ulimits as NVIDIA runs its TensorRT-LLM containers):
#   docker run --rm --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 \
#     -v lyre-models:/app/models -v lyre-engines:/app/engines \
#     lyre:gpu python build_engine.py --config config/model_config.yaml
#    (add -e HF_TOKEN=... if the checkpoint needs one; --dry-run prints the plan first)
# 2. Serve it (engines read-only; model.backend auto picks the TensorRT-LLM engine):
#   docker run --rm --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 \
#     -p 8000:8000 -p 50051:50051 -v lyre-models:/app/models -v lyre-engines:/app/engines:ro lyre:gpu
FROM nvcr.io/nvidia/tensorrt-llm/release:1.2.1

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    HF_HOME=/app/models/huggingface

RUN useradd --create-home --uid 10001 lyre
WORKDIR /app

COPY pyproject.toml README.md ./
COPY protos ./protos
COPY src ./src
# Lyre and the packages it needs beyond the container's, with every package the container already
# has held at its version (pip fails rather than replace torch, numpy, transformers, ...); then the
# gRPC stubs (generated, never committed, as setup.sh does). TensorRT-LLM's version is read from its
# metadata: importing it needs the CUDA driver, which a build machine may not have.
RUN pip list --format=freeze --exclude-editable > /tmp/container-constraints.txt \
 && pip install -c /tmp/container-constraints.txt -e ".[postgres]" \
 && python -m grpc_tools.protoc -Iprotos --python_out=src --pyi_out=src --grpc_python_out=src protos/lyre/v1/tts.proto \
 && python -c "import importlib.metadata as m, lyre; print('TensorRT-LLM', m.version('tensorrt_llm'))"
COPY config ./config
COPY production_server.py build_engine.py client.py benchmark.py ./

RUN mkdir -p models engines && chown -R lyre:lyre /app
USER lyre
VOLUME ["/app/models", "/app/engines"]

EXPOSE 8000 50051
# start-period: loading a 3B engine and warming up takes a while
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4).status != 200)"]
CMD ["python", "production_server.py", "--config", "config/model_config.yaml", "--host", "0.0.0.0", "--port", "8000", "--grpc-port", "50051"]
