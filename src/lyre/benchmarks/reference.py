"""The reference step of ``benchmark.py --mode engine --baseline reference``: the least a decode step of
the checkpoint can do, timed in the same run as Lyre's engine.

It is the minimal static-KV Llama (gpt-fast's shape of serving): one token per sequence, a KV cache
allocated once for the whole context of every sequence, attention over all of it masked to each
sequence's positions (PyTorch's SDPA on its memory-efficient kernel: a KV head's query heads as its
query rows), the logits of the whole vocabulary and the argmax, nothing
else: no scheduling, no sampling rules, no per-request state. It runs on the engine's own weights
(the same modules: int8 ones too) and on a GPU is captured as one CUDA graph per batch size; on a
CPU it runs eagerly, and is still the peer to beat. Lyre's step also samples with the frame-slot
constraint (computing a 4096-column band of ``lm_head``, not all of it), so it can beat this step.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from lyre.engine.torch.cuda_graphs import capture
from lyre.engine.torch.llama import SDPA_BACKENDS, Llama

STEPS = 20  # timed steps per batch size (after the warm-up or the capture)


class ReferenceStep:
    """Decode steps of ``batch`` sequences at ``position`` of a ``context``-token static cache."""

    def __init__(self, model: Llama, batch: int, context: int, position: int, kv_dtype: torch.dtype):
        cfg = model.cfg
        device = model.norm.weight.device
        self.model, self.batch, self.context = model, batch, context
        shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, context, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=kv_dtype, device=device)
        self.v = torch.zeros(shape, dtype=kv_dtype, device=device)
        self.tokens = torch.zeros(batch, dtype=torch.long, device=device)
        self.positions = torch.full((batch,), min(position, context - 1), dtype=torch.long, device=device)
        self.rows = torch.arange(batch, device=device)

    def __call__(self) -> torch.Tensor:
        """One step: the next token of every sequence (B,), left on the device."""
        m, b = self.model, self.batch
        x = m.embed(self.tokens)  # (B, H)
        cos = m.rope_cos[self.positions].unsqueeze(1)  # (B, 1, hd)
        sin = m.rope_sin[self.positions].unsqueeze(1)
        visible = torch.arange(self.context, device=x.device)[None, :] <= self.positions[:, None]  # (B, ctx)
        mask = torch.zeros(visible.shape, dtype=x.dtype, device=x.device).masked_fill_(~visible, float("-inf"))
        mask = mask[:, None, None, :]  # (B, 1, 1, ctx) additive, made once a step
        with torch.nn.attention.sdpa_kernel(SDPA_BACKENDS):
            for i, layer in enumerate(m.layers):
                attn = layer.self_attn
                q, k, v = attn.qkv(layer.input_layernorm(x), cos, sin)  # (B, nh, hd), (B, nkv, hd) x2, rotated
                self.k[i][self.rows, :, self.positions] = k.to(self.k.dtype)  # (B, nkv, hd) at each position
                self.v[i][self.rows, :, self.positions] = v.to(self.v.dtype)
                # a KV head's query heads as its query rows: (B, nkv, G, hd) against its K/V as they lie (SDPA's
                # enable_gqa with a mask would leave only the math backend, in float32 with K/V repeated)
                qg = q.view(b, attn.n_kv, attn.n_heads // attn.n_kv, attn.head_dim)
                out = F.scaled_dot_product_attention(qg, self.k[i], self.v[i], attn_mask=mask)  # (B, nkv, G, hd)
                x = x + attn.o_proj(out.reshape(b, attn.n_heads * attn.head_dim))
                x = x + layer.mlp(layer.post_attention_layernorm(x))
        return m.logits(m.norm(x)).argmax(dim=-1)  # the whole vocabulary, greedy

    def time_ms(self, steps: int = STEPS, graph: bool | None = None) -> float:
        """Milliseconds a step, over ``steps`` steps: replays of its CUDA graph on a GPU (``graph``
        None: whenever the model is on one), else eager steps after one untimed."""
        on_gpu = self.k.is_cuda
        graph = on_gpu if graph is None else graph
        with torch.inference_mode():
            run = capture(self, f"the reference step over {self.batch} sequences").replay if graph else self
            run()
            if on_gpu:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                run()
            if on_gpu:
                torch.cuda.synchronize()
        return 1000 * (time.perf_counter() - t0) / steps


def reference_levels(model: Llama, concurrency: list[int], context: int, position: int, kv_dtype: torch.dtype,
                     progress=print) -> dict[int, float]:
    """Step milliseconds of the reference at each batch size."""
    out = {}
    for b in concurrency:
        progress(f"reference step: {b} sequences at position {position} of {context} ...")
        step = ReferenceStep(model, b, context, position, kv_dtype)
        out[b] = step.time_ms()
        del step
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out
