"""Whole prompts prefilled over static shapes: on a GPU one CUDA graph per token bucket, so that a step
admitting new sessions costs their arithmetic, not launching a forward's kernels from Python.

A prompt is taken here when this step prefills all of it from position 0 (the common case: a
speech prompt is a few dozen tokens); a longer prompt's chunks, and a prompt after a kept prefix,
need the K/V already in their slot and run the host step. The step's prompts are packed into T rows
(the smallest bucket, a power of two from 16 up to ``max_prefill_tokens``, that holds them): every
row knows its prompt, position and slot. A row attends to the rows of its own prompt at or before
its position — all of its history is in this step, so attention reads no cache — and its K/V are
written into its slot. Padding rows (prompt -1) attend among themselves and write their K/V at the
cache's scratch position of slot 0, which no sequence reads: they change nothing.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from lyre.engine.torch.cuda_graphs import Graph, GraphPool, capture
from lyre.engine.torch.llama import SDPA_BACKENDS, KVCache, Llama
from lyre.engine.torch.sequence import Sequence
from lyre.engine.torch.static import additive, bucket, buckets
from lyre.engine.torch.transfer import upload

log = logging.getLogger("lyre.engine")

MIN_TOKENS = 16  # the smallest token bucket
TOKEN, POSITION, SLOT, PROMPT = range(4)  # the rows of a step's input


def prefill_rows(model: Llama, cache: KVCache, inputs: torch.Tensor) -> torch.Tensor:
    """Rows ``inputs`` (4, T) (token, position, slot, prompt; prompt -1: padding) through the decoder,
    their K/V written into their slots; the final normed hidden states (T, H)."""
    t = inputs.shape[1]
    tokens, positions, prompt = inputs[TOKEN], inputs[POSITION], inputs[PROMPT]
    valid = prompt >= 0
    slots = torch.where(valid, inputs[SLOT], 0)
    at = torch.where(valid, positions, cache.scratch)  # (padding writes where no sequence reads)
    x = model.embed(tokens)  # (T, H)
    visible = (prompt[:, None] == prompt[None, :]) & (positions[None, :] <= positions[:, None])  # (T, T)
    mask = additive(visible, x.dtype)[None, None]  # (1, 1, T, T), made once a step
    cos = model.rope_cos[positions].unsqueeze(1)  # (T, 1, hd)
    sin = model.rope_sin[positions].unsqueeze(1)
    with sdpa_kernel(SDPA_BACKENDS):
        for i, layer in enumerate(model.layers):
            attn = layer.self_attn
            q, k, v = attn.qkv(layer.input_layernorm(x), cos, sin)  # (T, nh, hd), (T, nkv, hd) x2
            cache.k[i][slots, :, at] = k.to(cache.k.dtype)
            cache.v[i][slots, :, at] = v.to(cache.v.dtype)
            group = attn.n_heads // attn.n_kv
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (T, nh, hd)
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None].to(q.dtype),
                                                 v.transpose(0, 1)[None].to(q.dtype), attn_mask=mask)  # (1, nh, T, hd)
            x = x + attn.o_proj(out[0].transpose(0, 1).reshape(t, attn.n_heads * attn.head_dim))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x)


class PrefillStep:
    """Runs a step's whole prompts by :func:`prefill_rows`: eagerly, or (``graphs``) by replaying the
    graph of its token bucket, every graph captured by :meth:`prepare` at start."""

    def __init__(self, model: Llama, cache: KVCache, max_tokens: int, graphs: bool = False):
        self.model, self.cache, self.max_tokens, self.graphs = model, cache, max_tokens, graphs
        device = cache.k.device
        self.inputs = torch.zeros(4, max_tokens, dtype=torch.long, device=device)  # every graph reads its [:, :T]
        self.host = torch.zeros(4, max_tokens, dtype=torch.long, pin_memory=device.type == "cuda")
        self._copied: torch.cuda.Event | None = None
        self._pool = GraphPool()
        self._captured: dict[int, Graph] = {}
        self.steps = self.padding = 0  # steps run, and padding rows run

    @property
    def token_buckets(self) -> list[int]:
        return buckets(MIN_TOKENS, self.max_tokens)

    @staticmethod
    def takes(seq: Sequence, n: int) -> bool:
        """Does a chunk of ``n`` tokens of ``seq`` run here: all of its prompt, from position 0?"""
        return seq.num_cached == 0 and n == seq.prompt_len

    def __call__(self, seqs: list[Sequence]) -> torch.Tensor:
        """Every prompt of ``seqs`` (none cached yet) through the decoder: the normed hidden state of each
        one's last token (N, H), in order. Their positions are not advanced here."""
        total = sum(s.prompt_len for s in seqs)
        t = bucket(total, MIN_TOKENS, self.max_tokens)
        assert total <= self.max_tokens, f"{total} prompt tokens in a step of at most {self.max_tokens}"
        self.steps, self.padding = self.steps + 1, self.padding + t - total
        if self._copied is not None:
            self._copied.synchronize()  # (the last copy has left the pinned buffer)
        host, last = self.host, []
        host[PROMPT].fill_(-1)
        host[:PROMPT].zero_()
        at = 0
        for i, s in enumerate(seqs):
            n = s.prompt_len
            host[TOKEN, at : at + n] = torch.tensor(s.request.prompt_ids)
            host[POSITION, at : at + n] = torch.arange(n)
            host[SLOT, at : at + n], host[PROMPT, at : at + n] = s.slot, i
            at += n
            last.append(at - 1)
        self.inputs.copy_(host, non_blocking=True)
        if self.inputs.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()
        graph = self._captured.get(t)
        if graph is not None:
            hidden = graph.replay()
        else:
            assert not self.graphs, f"no CUDA graph for {t} prompt tokens (prepare() captures them all)"
            hidden = prefill_rows(self.model, self.cache, self.inputs[:, :t])
        return hidden[upload(last, hidden.device)]  # (N, H)

    def prepare(self) -> None:
        """Capture every token bucket's graph now, at start. Raises GraphCaptureError naming the first
        bucket that fails."""
        self.inputs.zero_()
        self.inputs[PROMPT].fill_(-1)  # (warm-up and capture see only padding: it changes nothing)
        for t in self.token_buckets:
            if t not in self._captured:
                self._captured[t] = capture(lambda t=t: prefill_rows(self.model, self.cache, self.inputs[:, :t]),
                                            f"the prefill step over {t} prompt tokens", self._pool)
        log.info("prefill step: %d CUDA graphs captured (tokens %s)", len(self._captured), self.token_buckets)
