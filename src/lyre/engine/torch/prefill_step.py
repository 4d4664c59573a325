"""Whole prompts prefilled over static shapes: on a GPU one CUDA graph per token bucket, so that a step
admitting new sessions costs their arithmetic, not launching a forward's kernels from Python.

A prompt is taken here when this step prefills all of it from position 0 (the common case: a
speech prompt is a few dozen tokens); a longer prompt's chunks, and a prompt after a kept prefix,
need the K/V already in their slot and run the host step. The step's prompts are packed into T rows
(the smallest bucket, a power of two from 16 up to ``max_prefill_tokens``, that holds them): every
row knows its prompt, position and slot. A row attends to the rows of its own prompt at or before
its position — all of its history is in this step, so attention reads no cache — and its K/V are
written into its slot. Padding rows (prompt -1) attend among themselves and write their K/V at the
cache's scratch position of slot 0, which no sequence reads: they change nothing. The first token of
each audio row's prompt is sampled in the same graph, from its last row, as the decode step samples.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from lyre.engine.torch.audio_step import AudioPending
from lyre.engine.torch.cuda_graphs import Graph, GraphPool, capture
from lyre.engine.torch.llama import SDPA_BACKENDS, KVCache, Llama
from lyre.engine.torch.row_sampling import draw_bits
from lyre.engine.torch.sequence import Sequence
from lyre.engine.torch.slot_sampling import SlotSampling
from lyre.engine.torch.static import additive, bucket, buckets
from lyre.engine.torch.transfer import Staging

log = logging.getLogger("lyre.engine")

MIN_TOKENS = 16  # the smallest token bucket
TOKEN, POSITION, SLOT, PROMPT = range(4)  # the rows of a step's tokens
P_SAMPLED, P_SLOT, P_LAST, P_DRAW = range(4)  # the rows of its prompts (rows 4-7 of the input)


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
            cache.write(i, slots, at, k, v)
            group = attn.n_heads // attn.n_kv
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (T, nh, hd)
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None].to(q.dtype),
                                                 v.transpose(0, 1)[None].to(q.dtype), attn_mask=mask)  # (1, nh, T, hd)
            x = x + attn.o_proj(out[0].transpose(0, 1).reshape(t, attn.n_heads * attn.head_dim))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x)


def prefill_and_sample(model: Llama, cache: KVCache, sampling: SlotSampling, inputs: torch.Tensor,
                       prompts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`prefill_rows` of ``inputs`` (4, T), then the first token of each prompt of ``prompts``
    (4, P: sampled, slot, last row, draw; a prompt not sampled here names the sampling's scratch row):
    each prompt's last hidden state (P, H), and its token (P,) and logits (P, 4097) as the decode
    step makes them (frame slot 0, nothing generated, its window counts reset)."""
    hidden = prefill_rows(model, cache, inputs)  # (T, H)
    last = hidden[prompts[P_LAST]]  # (P, H)
    valid, slots = prompts[P_SAMPLED] > 0, prompts[P_SLOT]
    sampling.clear(slots)  # (a first token: a retried step counts it once)
    start = torch.zeros_like(slots)
    ids, logits = sampling.sample(model, last, slots, valid, start, start, prompts[P_DRAW])
    return last, ids, logits


class PrefillStep:
    """Runs a step's whole prompts by :func:`prefill_and_sample`: eagerly, or (``graphs``) by replaying
    the graph of its token bucket (T tokens, up to T / 4 prompts), every graph captured by
    :meth:`prepare` at start. A prompt of an audio row gets its first token in the same graph."""

    def __init__(self, model: Llama, cache: KVCache, sampling: SlotSampling, max_tokens: int, graphs: bool = False):
        self.model, self.cache, self.sampling, self.graphs = model, cache, sampling, graphs
        self.max_tokens = max(MIN_TOKENS, max_tokens)
        # tokens (4, T) in rows 0-3, prompts (4, P) in rows 4-7; each graph reads its T and P columns
        self.staging = Staging(8, self.max_tokens, cache.k.device)
        self.inputs = self.staging.inputs
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

    def fits(self, seqs: list[Sequence]) -> int:
        """How many of ``seqs`` (in order) one step holds: their tokens within the largest bucket, and
        at most a quarter as many prompts."""
        total = 0
        for i, s in enumerate(seqs):
            total += s.prompt_len
            if total > self.max_tokens or 4 * (i + 1) > self.max_tokens:
                return i
        return len(seqs)

    def _views(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[:4, :t], self.inputs[4:, : t // 4]

    def __call__(self, seqs: list[Sequence]) -> tuple[torch.Tensor, AudioPending | None]:
        """Every prompt of ``seqs`` (none cached yet; :meth:`fits` all of them) through the decoder: the
        normed hidden state of each one's last token (N, H), in order, and the first tokens of those
        sampled on the device (``on_device``), not read back. Their positions are not advanced here."""
        total = sum(s.prompt_len for s in seqs)
        assert self.fits(seqs) == len(seqs), f"{len(seqs)} prompts of {total} tokens in one prefill step"
        t = bucket(max(total, 4 * len(seqs)), MIN_TOKENS, self.max_tokens)
        self.steps, self.padding = self.steps + 1, self.padding + t - total
        host = self.staging.host()  # (8, max_tokens)
        host[:4] = 0
        host[PROMPT] = -1
        host[4:] = 0
        host[4 + P_SLOT] = self.sampling.scratch
        host[4 + P_DRAW, : len(seqs)] = draw_bits([s.seed for s in seqs], [0] * len(seqs))  # (first tokens)
        at = 0
        for i, s in enumerate(seqs):
            n = s.prompt_len
            host[TOKEN, at : at + n] = s.request.prompt_ids
            host[POSITION, at : at + n] = np.arange(n)
            host[SLOT, at : at + n], host[PROMPT, at : at + n] = s.slot, i
            at += n
            host[4 + P_SAMPLED, i], host[4 + P_SLOT, i], host[4 + P_LAST, i] = s.on_device, s.slot, at - 1
        self.staging.send()
        graph = self._captured.get(t)
        if graph is not None:
            last, ids, logits = graph.replay()
        else:
            assert not self.graphs, f"no CUDA graph for {t} prompt tokens (prepare() captures them all)"
            last, ids, logits = prefill_and_sample(self.model, self.cache, self.sampling, *self._views(t))
        sampled = [i for i, s in enumerate(seqs) if s.on_device]
        first = AudioPending([seqs[i] for i in sampled], sampled, ids, logits) if sampled else None
        return last[: len(seqs)], first

    def prepare(self) -> None:
        """Capture every token bucket's graph now, at start. Raises GraphCaptureError naming the first
        bucket that fails."""
        self.inputs.zero_()
        self.inputs[PROMPT].fill_(-1)  # (warm-up and capture see only padding: it changes nothing)
        self.inputs[4 + P_SLOT].fill_(self.sampling.scratch)
        for t in self.token_buckets:
            if t not in self._captured:
                self._captured[t] = capture(
                    lambda t=t: prefill_and_sample(self.model, self.cache, self.sampling, *self._views(t)),
                    f"the prefill step over {t} prompt tokens", self._pool)
        log.info("prefill step: %d CUDA graphs captured (tokens %s)", len(self._captured), self.token_buckets)
