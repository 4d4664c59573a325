"""ModelExecutor: a FAKE TensorRT-LLM executor (``tests/support/fake_trtllm.py``'s) whose logits come
from the engine's own checkpoint, computed by transformers on the CPU in float32: what a real engine
built from that checkpoint computes, without a GPU. The acceptance run's parity stages compare it
with Lyre's PyTorch engine; the plain fake (seeded random logits) shows them failing.

The checkpoint is the one the engine's manifest names (``model_source``), loaded once per path. Each
running request keeps its own transformers KV cache, so a step computes only its new tokens (the
logits are the same as recomputing the whole sequence, to float32 rounding).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from lyre.engine.backend import Manifest
from tests.support import fake_trtllm as tle

_MODELS: dict[str, object] = {}


def _model(path: str):
    if path not in _MODELS:
        from transformers import LlamaForCausalLM

        _MODELS[path] = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return _MODELS[path]


class ModelExecutor(tle.Executor):
    def __init__(self, model_path, model_type, executor_config):
        super().__init__(model_path, model_type, executor_config)
        self.model = _model(Manifest.read(Path(model_path)).model_source)
        self._caches: dict[int, tuple[list[int], object]] = {}  # request id -> (tokens it has seen, its KV cache)

    def _logits(self, r) -> torch.Tensor:
        from transformers import DynamicCache

        seen, cache = self._caches.get(r.id, ([], None))
        if cache is None or r.tokens[: len(seen)] != seen:
            seen, cache = [], DynamicCache()
        new = r.tokens[len(seen):]  # (what the cache has not seen: the prompt, then a token a step)
        with torch.inference_mode():
            out = self.model(torch.tensor([new]), past_key_values=cache, use_cache=True,
                             logits_to_keep=1).logits  # (1, 1, vocab)
        self._caches = {rid: held for rid, held in self._caches.items() if rid in self._queue}  # (ended: dropped)
        self._caches[r.id] = (list(r.tokens), cache)
        return out.float().reshape(1, 1, -1).clone()  # (1, beam, vocab), as the executor hands them out


def bindings(executor: type = ModelExecutor) -> ModuleType:
    """The fake bindings module with ``executor`` as its Executor."""
    module = ModuleType("fake_bindings")
    module.__dict__.update({name: getattr(tle, name) for name in tle.__all__}, Executor=executor)
    return module
