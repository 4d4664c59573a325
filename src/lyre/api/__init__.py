"""Front ends: REST + WebSocket (aiohttp) and gRPC (grpc.aio). No model logic lives here."""
