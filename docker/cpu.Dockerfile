# Lyre on CPU: the PyTorch backend and the ONNX Runtime codec, on a slim Python image.
#
#   docker build -f docker/cpu.Dockerfile -t lyre:cpu .
#   docker run --rm -p 8000:8000 -p 50051:50051 -v lyre-models:/app/models lyre:cpu
#
# Without real weights in /app/models (or the Hugging Face cache under it) the server speaks with
# the demo checkpoint, whose audio is noise. To fetch and verify the real checkpoint into the
# volume first (needs network):
#   docker run --rm -v lyre-models:/app/models lyre:cpu python build_engine.py --backend torch
# Settings: mount a config at /app/config/model_config.yaml, or append `--set section.key=value`.
#
# This project's machines cannot build images (no registry); tests/test_docker.py checks this file
# statically: every COPY source and every command it runs exist in the repository, a non-root USER,
# a HEALTHCHECK, and the model and engine directories as volumes.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/app/models/huggingface

RUN useradd --create-home --uid 10001 lyre
WORKDIR /app

# The CPU build of torch from PyTorch's CPU index: PyPI's default torch wheel is the CUDA build (GBs).
RUN pip install torch==2.9.1 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY protos ./protos
COPY src ./src
# gRPC stubs are generated, never committed (as setup.sh does), then Lyre itself (no dev extra; the
# postgres extra: replicas share their registry and audit trail in PostgreSQL)
RUN pip install -e ".[postgres]" \
 && python -m grpc_tools.protoc -Iprotos --python_out=src --pyi_out=src --grpc_python_out=src protos/lyre/v1/tts.proto
COPY config ./config
COPY production_server.py build_engine.py client.py benchmark.py ./

RUN mkdir -p models engines && chown -R lyre:lyre /app
USER lyre
# the default model (the demo checkpoint where no real weights are present) and the streaming
# codec exported for ONNX Runtime (~30 s), so the first start is quick
RUN lyre checkpoint resolve && lyre codec prepare
VOLUME ["/app/models", "/app/engines"]

EXPOSE 8000 50051
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4).status != 200)"]
CMD ["python", "production_server.py", "--config", "config/model_config.yaml", "--host", "0.0.0.0", "--port", "8000", "--grpc-port", "50051"]
