"""In-flight batching over pre-allocated KV slots, in PyTorch.

``TorchEngine.step()`` reads as schedule -> run -> postprocess:

- schedule: free the slots of cancelled requests, take as decoding requests the first
  ``max_batch_size`` ready ones in the caller's ``order`` (default: earliest admitted first), and
  fill the prefill budget (``max_prefill_tokens``) with prompt chunks of requests still prefilling;
- run: one forward over all of it (decode tokens and prompt chunks together), logits only for the
  rows that sample, batched sampling;
- postprocess: record tokens, finish on stop ids / max_tokens / a full slot, free those slots.

A step that raises is run again one request at a time (each alone: its decode row or its prompt
chunk), after undoing what the failed attempt changed (positions, random generators; K/V it may
have written are written again), so a fault (a bad value in the sampler, a prefill or decode that
fails for one request) ends only the request that causes it, with finish_reason "error"; the
others get their tokens from the same step (seeded: the very tokens the batch would have given).

With ``constrain_audio``, once a request is past start-of-speech only the 4096 ids of its current
frame slot (plus end-of-speech at frame boundaries) can be sampled, and only those rows of
``lm_head`` are computed.

On a GPU (``on_device_decode``), requests constrained from their first token (their prompt ends with
start-of-speech: every Orpheus speech request) decode by the on-device audio step
(:mod:`lyre.engine.torch.audio_step`): the decoder over static shapes and their sampling on the
device, one CUDA graph per (slot bucket, length bucket), captured at start. Prompt chunks and other
rows run the host step above in the same ``step()``, and the step's tokens are read back once. Each
``step()`` ends by launching the audio rows' next step without waiting for it (:mod:`.on_device`):
the device computes it while the caller handles the deltas, and the next ``step()`` delivers it.

``add`` puts a request into the lowest free slot at once, or returns False when none is free: the
engine keeps no queue and never asks its caller anything.

A request with a ``prefix_key`` (a cloned voice's reference turn) gets that prefix's K/V copied
into its slot from the :class:`~lyre.engine.torch.prefix_cache.PrefixCache` when it is there, and
prefills only the rest of its prompt; when it is not, the first request computes it and a copy is
kept once its prefill has passed the prefix.
"""

from __future__ import annotations

import collections.abc
import itertools
import logging
import random

import torch

from lyre.cpu import LEDGER
from lyre.engine.base import EngineStats, GenerationRequest, TokenDelta, check_prompt
from lyre.engine.torch.config import TorchEngineConfig
from lyre.engine.torch.host_heap import keep_freed_memory
from lyre.engine.torch.kept_prefixes import KeptPrefixes
from lyre.engine.torch.llama import ForwardBatch, KVCache, Llama, load_llama
from lyre.engine.torch.on_device import OnDevice
from lyre.engine.torch.prefix_cache import PrefixCache
from lyre.engine.torch.quantize import quantize
from lyre.engine.torch.sampler import StepSampler, read_back
from lyre.engine.torch.sequence import Sequence, SlotPool
from lyre.engine.torch.transfer import upload
from lyre.model import checkpoint, orpheus

log = logging.getLogger("lyre.engine")



# --------------------------------------------------------------------------------------------
# the engine


class TorchEngine:
    PROMPT_UNIT = "tokens"  # what a prompt position is, in error messages

    def __init__(self, model: Llama, config: TorchEngineConfig):
        self.model = model
        self.cfg = config
        self.device = torch.device(config.device)
        self.capacity = config.slots
        mc = model.cfg
        self.cache = KVCache(mc, config.slots, config.max_seq_len, config.kv_dtype, self.device)
        log.info(
            "KV cache: %d slots x %d layers x 2 x %d kv heads x %d head dim x %d tokens x %d bytes = %.2f GiB",
            config.slots, mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim, config.max_seq_len,
            self.cache.k.element_size(), self.cache.nbytes / 2**30,
        )
        self.slots = SlotPool(config.slots)
        self.sampler = StepSampler(model, self.device)  # the step's logits and draws
        self._order = itertools.count()
        self.total_requests = self.total_tokens = self.total_steps = 0
        self.prompt_tokens = self.prefilled_tokens = 0
        self.prefixes = PrefixCache(config.prefix_cache_bytes) if config.prefix_cache_bytes else None
        self.kept = KeptPrefixes(self.prefixes, self.cache) if self.prefixes is not None else None
        # on a GPU: audio rows' decode and whole prompts' prefill over static shapes (CUDA graphs); else None
        self.on_device = self._on_device()

    def _on_device(self) -> OnDevice | None:
        return OnDevice(self.model, self.cache, self.cfg, self.device) if self.cfg.on_device_decode else None

    @classmethod
    def from_checkpoint(cls, model_dir, config: TorchEngineConfig) -> TorchEngine:
        llama_cfg = checkpoint.read_llama_config(model_dir)
        device = torch.device(config.device)
        weights = checkpoint.load_llama_weights(model_dir, llama_cfg, device=device)
        if config.keep_freed_memory and torch.device(config.device).type == "cpu":
            keep_freed_memory()  # (host_heap.py: a step's large temporaries without page faults)
        model = load_llama(llama_cfg, weights, config.max_seq_len, config.dtype, device)
        del weights  # (the float copies: int8 keeps only its own)
        return cls(quantize(model, config.quantize, device, config.dtype), config)

    # --- the contract ---------------------------------------------------------------------------

    def add(self, request: GenerationRequest) -> bool:
        """Put ``request`` into the lowest free slot (its prefill starts at the next step) and return
        True; return False, keeping nothing, when every slot is held. Raises ValueError for a
        request that can never run (bad ids, prompt too long, duplicate id, bad sampling values)."""
        self._check(request)
        if request.prompt_len >= self.cfg.max_seq_len:
            raise ValueError(
                f"the prompt has {request.prompt_len} {self.PROMPT_UNIT}; a slot holds {self.cfg.max_seq_len} "
                f"(kv_cache.max_seq_len), leaving no room to generate"
            )
        request.sampling.validate()
        if not self.slots.free:
            return False
        seed = request.sampling.seed if request.sampling.seed is not None else random.getrandbits(63)
        generator = torch.Generator().manual_seed(seed)
        seq = self._sequence(request, generator)
        seq.seed = seed
        self.slots.admit(seq)
        self._admitted(seq)
        if self.kept is not None:
            self.kept.reuse(seq)
        self.prompt_tokens += request.prompt_len
        self.total_requests += 1
        return True

    def _admitted(self, seq: Sequence) -> None:
        """``seq`` holds its slot now: what of it lives on the device is written there."""
        if self.on_device is not None:
            self.on_device.admit(seq)

    def _check(self, request: GenerationRequest) -> None:
        """ValueError naming what makes ``request``'s prompt unrunnable."""
        check_prompt(request, self.model.cfg.vocab_size, self.slots.by_id)

    def _sequence(self, request: GenerationRequest, generator: torch.Generator) -> Sequence:
        """The engine's state of a request being admitted."""
        seq = Sequence(request=request, order=next(self._order), generator=generator)
        if request.prompt_ids[-1] == orpheus.START_OF_SPEECH:
            seq.audio_k = 0
        return seq

    def kept_prefixes(self) -> list[str]:
        return self.kept.keys() if self.kept is not None else []

    def forget_prefix(self, name: str) -> None:
        if self.kept is not None:
            self.kept.forget(name)

    def cancel(self, request_id: str) -> None:
        """End a request; its slot is free at the next step. Unknown ids are ignored."""
        seq = self.slots.by_id.get(request_id)
        if seq is not None:
            seq.cancelled = True

    def has_work(self) -> bool:
        return bool(self.slots.by_id)

    def stats(self) -> EngineStats:
        return EngineStats(
            capacity=self.capacity,
            active=len(self.slots.by_slot),
            waiting=0,  # no queue: add() refuses when every slot is held
            prefilling=sum(s.prefilling for s in self.slots.by_slot.values()),
            total_requests=self.total_requests,
            total_tokens=self.total_tokens,
            total_steps=self.total_steps,
            kv_cache_bytes=self.cache.nbytes,
            prompt_tokens=self.prompt_tokens,
            prefilled_tokens=self.prefilled_tokens,
            extra=self.prefixes.stats() if self.prefixes is not None else {},
        )

    @torch.inference_mode()
    def step(self, order: collections.abc.Sequence[str] | None = None) -> list[TokenDelta]:
        """One iteration: schedule -> run -> postprocess. Returns this step's deltas.

        ``order``: request ids allowed to decode, most urgent first; the first ``max_batch_size``
        of them that are ready decode (unknown ids are ignored). ``None``: every ready request,
        earliest admitted first. Prompt prefill goes on for every request still prefilling, in
        ``order`` or not — except a batch item's (negative priority), which prefills only when it is in
        ``order`` — and a request whose prefill completes samples its first token."""
        deltas = self._reap_cancelled()
        decode, prefill = self._schedule(order)
        if not decode and not prefill:
            return deltas
        try:
            deltas += self._run(decode, prefill)
        except Exception:  # a fault stays with the request that caused it: find it
            log.exception("engine step failed; running its %d requests one at a time", len(decode) + len(prefill))
            deltas += self._isolate(decode, prefill)
        if self.on_device is not None:
            self.on_device.launch_ahead(self.slots.by_slot.values())
        return deltas

    def _run(self, decode: list[Sequence], prefill: list[tuple[Sequence, int]]) -> list[TokenDelta]:
        """build -> forward -> sample -> postprocess, the step's tokens read back from the device once.

        Audio rows whose token was computed ahead (``OnDevice.launch_ahead``) are delivered, the launched
        step's outputs read back with the rest; whole prompts prefill by their own step on the device
        (``on_device.prefill``), audio rows not computed ahead decode by theirs (``on_device.audio``), last:
        it moves their sampling state on the device, so nothing after it may fail. On failure every
        sequence is as it was before (positions, random generators), so the step can be run again: a
        forward that failed midway may have written K/V at these positions, and a retry writes the
        same positions again."""
        seqs = decode + [seq for seq, _ in prefill]
        saved = [(s.num_cached, s.generator.get_state()) for s in seqs]
        delivered = [s for s in decode if s.ahead]
        on_device = [s for s in decode if s.on_device and not s.ahead]
        steps = self.on_device
        whole = steps.whole_prompts(prefill) if steps is not None else []
        host_decode = [s for s in decode if not s.on_device] if on_device or delivered else decode
        host_prefill = [p for p in prefill if p not in whole] if whole else prefill
        try:
            flight = steps.flight() if steps is not None else None  # (before any replay)
            pending = []
            if host_decode or host_prefill:
                batch, samplers = self._build(host_decode, host_prefill)
                with LEDGER.measure("model"):
                    hidden = self._forward(batch)  # (N, H): one row per sampling sequence
                with LEDGER.measure("sampling"):
                    pending = self._start_sampling(samplers, hidden)
            if whole:
                prompts = [s for s, _ in whole]
                with LEDGER.measure("model"):
                    hidden, first = steps.prefill(prompts)  # (N, H) each prompt's last; audio rows' tokens
                for s, n in whole:
                    s.num_cached += n
                pending += [first] if first is not None else []
                rest = [i for i, s in enumerate(prompts) if not s.on_device]
                if rest:
                    with LEDGER.measure("sampling"):
                        pending.append(self.sampler.start([prompts[i] for i in rest], hidden[upload(rest, self.device)]))
            if on_device:  # (only after a launch ahead failed; a retry of this step counts its tokens twice in the
                # penalty's window: the step is last so that nothing but the read-back can fail after it)
                with LEDGER.measure("model"):
                    pending.append(steps.audio(on_device))
                for s in on_device:
                    s.num_cached += 1
            if self.kept is not None:
                for s, _ in prefill:
                    self.kept.keep(s)
            samplers = [s for p in pending for s in p.seqs]  # (in the order the parts finish)
            tokens, logits, logit_ids = read_back(([flight] if flight else []) + pending)
            # (nothing below may fail: the launched step's tokens and the rows' positions have moved on)
        except Exception:
            for s, (cached, rng) in zip(seqs, saved, strict=True):
                s.num_cached = cached
                s.generator.set_state(rng)
            raise
        if flight is not None:  # the launched step's tokens, kept until their rows are asked for
            n = steps.landed(flight, tokens, logits, logit_ids)
            tokens, logits, logit_ids = tokens[n:], logits[n:], logit_ids[n:]
        for s in delivered:
            (token, lg, ids), s.ahead_token, s.ahead = s.ahead_token, None, False
            samplers.append(s)
            tokens.append(token)
            logits.append(lg)
            logit_ids.append(ids)
        self.total_steps += 1
        self.prefilled_tokens += sum(n for _, n in prefill)
        return self._postprocess(samplers, tokens, logits, logit_ids)

    def _start_sampling(self, seqs: list[Sequence], hidden: torch.Tensor) -> list:
        """The sampling of ``seqs`` (rows of ``hidden``) queued on the device, nothing read back: audio
        rows by their on-device sampler, the others by the host-decided one. Each part has ``seqs``,
        ``cols`` (to read back) and ``finish(cols read back)``."""
        if not seqs:
            return []
        audio = [i for i, s in enumerate(seqs) if s.on_device]
        if not audio:
            return [self.sampler.start(seqs, hidden)]
        rest = [i for i, s in enumerate(seqs) if not s.on_device]
        parts = [self.on_device.audio.sample([seqs[i] for i in audio], hidden[upload(audio, self.device)])]
        if rest:
            parts.append(self.sampler.start([seqs[i] for i in rest], hidden[upload(rest, self.device)]))
        return parts

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.model(batch, self.cache)

    def _isolate(self, decode: list[Sequence], prefill: list[tuple[Sequence, int]]) -> list[TokenDelta]:
        """The failed step again, one request at a time: only those that fail alone finish with an
        error; the others get this step's tokens (the same ones, seeded, as in the batch)."""
        deltas = []
        for seq, alone in [(s, ([s], [])) for s in decode] + [(s, ([], [(s, n)])) for s, n in prefill]:
            try:
                deltas += self._run(*alone)
            except Exception as e:  # noqa: BLE001 - this request's own fault
                log.warning("request %s failed alone: %s: %s", seq.request.request_id, type(e).__name__, e)
                deltas.append(self._finish(seq, "error", f"{type(e).__name__}: {e}"))
        return deltas

    # --- schedule -------------------------------------------------------------------------------

    def _reap_cancelled(self) -> list[TokenDelta]:
        return [self._finish(s, "cancelled") for s in list(self.slots.by_slot.values()) if s.cancelled]

    def _schedule(
        self, order: collections.abc.Sequence[str] | None
    ) -> tuple[list[Sequence], list[tuple[Sequence, int]]]:
        """The decoding sequences (the first ``max_batch_size`` ready ones of ``order``), and
        (sequence, chunk length) prompt chunks."""
        if order is None:
            candidates = sorted(self.slots.by_slot.values(), key=lambda s: s.order)
        else:
            candidates = [self.slots.by_id[rid] for rid in dict.fromkeys(order) if rid in self.slots.by_id]
        decode = [s for s in candidates if not s.prefilling][: self.cfg.max_batch_size]
        budget = self.cfg.max_prefill_tokens
        prefill = []
        allowed = None if order is None else set(order)  # (a batch item prefills only when it may run)
        waiting_prompts = sorted(
            (s for s in self.slots.by_slot.values()
             if s.prefilling and (s.request.priority >= 0 or allowed is None or s.request.request_id in allowed)),
            key=lambda s: (-s.request.priority, s.order),
        )
        for seq in waiting_prompts:
            if budget <= 0:
                break
            left = seq.prompt_len - seq.num_cached
            if self.on_device is not None and seq.num_cached == 0 and budget < left <= self.cfg.max_prefill_tokens:
                break  # (whole in the next step, by the prefill graph, rather than a piece of it on the host now)
            n = min(budget, left)
            prefill.append((seq, n))
            budget -= n
        return decode, prefill

    # --- run ------------------------------------------------------------------------------------

    def _build(
        self, decode: list[Sequence], prefill: list[tuple[Sequence, int]]
    ) -> tuple[ForwardBatch, list[Sequence]]:
        seqs = [(s.slot, s.num_cached, [s.next_input], True) for s in decode]
        samplers = list(decode)
        for s, n in prefill:
            done = s.num_cached + n == s.prompt_len
            seqs.append((s.slot, s.num_cached, s.request.prompt_ids[s.num_cached : s.num_cached + n], done))
            if done:
                samplers.append(s)
        for s in decode:
            s.num_cached += 1
        for s, n in prefill:
            s.num_cached += n
        return ForwardBatch.build(seqs, self.device), samplers

    # --- postprocess ----------------------------------------------------------------------------

    def _postprocess(self, seqs, tokens, logits, logit_ids) -> list[TokenDelta]:
        deltas = []
        for s, tok, lg, ids in zip(seqs, tokens, logits, logit_ids, strict=True):
            s.generated(tok)
            self.total_tokens += 1
            p = s.params
            reason = None
            if tok in p.stop_ids:
                reason = "stop"
            elif s.num_generated >= p.max_tokens or s.num_cached >= self.cfg.max_seq_len:
                reason = "length"
            deltas.append(self._delta(s, [tok], reason, lg, ids))
        return deltas

    def _delta(self, s: Sequence, tokens: list[int], reason: str | None, logits: torch.Tensor | None,
               logit_ids: torch.Tensor | None) -> TokenDelta:
        """A sampling row's delta; with a finish ``reason`` its slot is freed."""
        delta = TokenDelta(s.request.request_id, tokens)
        if logits is not None:
            delta.logits, delta.logits_ids = logits[None], logit_ids[None]
        if reason is not None:
            self.slots.release(s)
            delta.finished, delta.finish_reason = True, reason
        return delta

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> TokenDelta:
        self.slots.release(seq)
        return TokenDelta(seq.request.request_id, [], finished=True, finish_reason=reason, error=error)
