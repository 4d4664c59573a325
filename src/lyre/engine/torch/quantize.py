"""int8 weights for the PyTorch engine on a CPU (``model.quantize: int8``).

The decoder layers' linear projections (q/k/v, o, gate/up, down) become torch's own dynamically
quantized linears: weights int8, one scale per output channel, and activations quantized per call,
so each matmul is an int8 one (fbgemm / oneDNN kernels, VNNI or AMX where the CPU has them) reading
a quarter of fp32's bytes. ``lm_head`` gets an int8 copy for logits over the whole vocabulary
(before start-of-speech, or with ``sampling.constrain_audio`` off: at batch 1 its 157k x hidden
matmul is most of a step); a frame slot's 4096 rows (constrained audio) stay float32, as do the
embeddings, norms and attention. On the small demo shape on the 2-core machine
this doubles tokens/s or more (docs/benchmarks.md); how close its tokens stay to float32's is held
by ``tests/engine/test_quantize.py``.

torch marks ``torch.ao.quantization`` as moving to torchao; torchao's CPU int8 paths measured
slower here (11 ms against 3.4 ms for the full-vocabulary ``lm_head`` at batch 1), so torch's own is
used, its deprecation warning silenced here, and this module is the one place to change.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

QUANTIZATIONS = ("none", "int8")


def quantize(model: nn.Module, how: str, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """``model`` with its decoder layers' linears quantized as ``how`` says (in place); ValueError where
    that cannot run (int8: a CPU and float32 only)."""
    if how == "none":
        return model
    if how not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {how!r}: one of {', '.join(QUANTIZATIONS)}")
    if device.type != "cpu" or dtype != torch.float32:
        raise ValueError(f"model.quantize int8 runs on a CPU in float32 (this engine: {device.type}, {dtype}); "
                         "on a GPU, TensorRT-LLM's FP8 engine is the quantized path")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.ao.quantization's notice that it moves to torchao)
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        for layer in model.layers:
            quantize_dynamic(layer, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
        weight = model.lm_head_t.detach().T  # (V, H), a view
        head = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        head.weight = nn.Parameter(weight, requires_grad=False)  # (quantize_dynamic copies it to int8)
        model.full_logits = quantize_dynamic(nn.Sequential(head), {nn.Linear: per_channel_dynamic_qconfig},
                                             dtype=torch.qint8)
    return model
