"""Token engines: the ``TokenEngine`` contract and its backends (PyTorch; TensorRT-LLM, see backend.py)."""

from lyre.engine.base import EngineStats, GenerationRequest, SamplingParams, TokenDelta, TokenEngine

__all__ = ["EngineStats", "GenerationRequest", "SamplingParams", "TokenDelta", "TokenEngine"]
