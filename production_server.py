#!/usr/bin/env python
"""Lyre production server: REST + WebSocket (aiohttp) and gRPC (grpc.aio) over one engine.

  python production_server.py --config config/model_config.yaml --port 8000 [--grpc-port 50051]
                              [--host 0.0.0.0] [--set section.key=value ...]

The same as ``lyre serve``; ``--help`` says everything (:mod:`lyre.server`).
"""

from lyre.server import main

if __name__ == "__main__":
    raise SystemExit(main())
