"""llama.cpp generating Orpheus tokens for many sequences at once: the peer of ``benchmark.py
--baseline llamacpp``, through ``llama-cpp-python``'s bindings of llama.cpp's C API (the optional
``.[peer]`` extra; the server never needs it).

This is llama.cpp's own batched decoding, as ``llama-server --parallel N`` runs it: one context with
a sequence id per request over one unified KV buffer (``kv_unified``: llama-server's default; with
a stream per sequence this release splits a step's batch per sequence, and 16 sequences step 6x
slower on the small shape), one ``llama_decode`` per step over every sequence's next
token (a new request's whole prompt joins the step it is admitted in: continuous batching), and per
sequence llama.cpp's sampler chain (repetition penalty over the last 64 generated tokens, top-k,
top-p, temperature, a seeded draw), as Lyre samples.

The frame-slot constraint (``sampling.constrain_audio``, on by default) is a logit bias: before the
sampler chain reads a sequence's logits, every id outside the 4,096 codes of its frame slot (and
outside end-of-speech at a frame boundary) is set to -inf in llama.cpp's own logits buffer — what a
``logit_bias`` of -inf on all those ids does, without a 150k-entry bias list per call. It makes
random demo weights speak as Lyre's constraint does; with real Orpheus weights it is a no-op in
practice. A GBNF grammar would say the same but llama.cpp's grammar sampler scans the whole
vocabulary's text per token, which no Orpheus server does.

:class:`LlamaCpp` runs steps in whoever calls :meth:`LlamaCpp.step` — the engine benchmark itself,
or :class:`lyre.benchmarks.peer.service`'s generation thread.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lyre.config import ConfigError
from lyre.cpu import LEDGER
from lyre.model import orpheus

PENALTY_WINDOW = 64  # Lyre's repetition-penalty window (generated tokens)
MAX_BATCH_TOKENS = 2048  # prompt tokens + decode tokens one llama_decode takes


PINNED = "0.3.36"  # the bindings this file is written against (pyproject's .[peer] pins it)


def import_llama_cpp():
    """The ``llama_cpp`` module, or a clear error naming the extra that installs it (checked before
    any GGUF is exported: the export alone takes a while)."""
    try:
        import gguf  # noqa: F401 - (the export's writer)
        import llama_cpp
    except ImportError:
        raise ConfigError("the llama.cpp peer needs llama-cpp-python and gguf: pip install -e '.[peer]' "
                          "(it builds llama.cpp from source: a few minutes)") from None
    # llama.cpp's C API changes between releases, and ctypes passes whatever it is given: a
    # sampler's arguments in the wrong places would not fail, they would sample differently
    if llama_cpp.__version__ != PINNED or len(llama_cpp.llama_sampler_init_penalties.argtypes) != 5:
        raise ConfigError(f"the llama.cpp peer is written against llama-cpp-python {PINNED}; "
                          f"{llama_cpp.__version__} is installed: pip install -e '.[peer]'")
    return llama_cpp


@dataclass
class PeerSampling:
    """Lyre's sampling parameters, as the peer applies them."""

    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    max_tokens: int
    seed: int = 0
    constrain_audio: bool = True
    stop_ids: tuple[int, ...] = orpheus.STOP_IDS


@dataclass
class PeerSequence:
    """One request in the batch: its prompt, what it generated and its sampler chain."""

    prompt: list[int]
    sampling: PeerSampling
    # (new tokens, finished, error or None), called from the stepping thread
    on_tokens: Callable[[list[int], bool, str | None], None] | None = None
    generated: list[int] = field(default_factory=list)
    seq_id: int = -1
    fed: int = 0  # tokens of prompt + generated already in the cache
    cancelled: bool = False
    done: bool = False
    _chain: object = None

    def fail(self, error: str) -> None:
        if self.on_tokens is not None:
            try:
                self.on_tokens([], True, error)
            except Exception:  # noqa: BLE001 - (its listener is gone too)
                pass


_silence: list = []  # the log callback llama.cpp keeps (process-wide): alive as long as the process


def _silent_logger(lc):
    if not _silence:
        _silence.append(lc.llama_log_callback(lambda level, text, data: None))
    return _silence[0]


class LlamaCpp:
    """A GGUF model in one llama.cpp context of ``sequences`` parallel sequences."""

    def __init__(self, gguf_path: str | Path, sequences: int, ctx_per_sequence: int, threads: int | None = None,
                 quiet: bool = True, extra_buffers: bool = False):
        lc = self._lc = import_llama_cpp()
        if quiet:  # llama.cpp prints every tensor it loads to stderr otherwise
            lc.llama_log_set(_silent_logger(lc), ctypes.c_void_p())
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        # Extra buffer types repack weights for the CPU's fastest kernels; on a CPU that reports AMX
        # this release's AMX kernel segfaults in llama_decode where the kernel withholds the tile
        # state (seen on this project's 2-core Sapphire Rapids VMs), so they are off by default.
        mparams.use_extra_bufts = extra_buffers
        self._model = lc.llama_model_load_from_file(str(gguf_path).encode(), mparams)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self._model))
        threads = threads or os.cpu_count() or 1
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = sequences * ctx_per_sequence
        cparams.n_seq_max = sequences
        cparams.n_batch = cparams.n_ubatch = self.max_batch = min(MAX_BATCH_TOKENS, cparams.n_ctx)
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.kv_unified = True
        cparams.no_perf = True
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lc.llama_model_free(self._model)
            raise RuntimeError(f"llama.cpp could not make a context of {sequences} x {ctx_per_sequence} tokens")
        self._memory = lc.llama_get_memory(self._ctx)
        self._batch = lc.llama_batch_init(MAX_BATCH_TOKENS, 0, 1)
        self.sequences, self.ctx_per_sequence, self.threads = sequences, ctx_per_sequence, threads
        self.free_ids = list(range(sequences))
        self.running: list[PeerSequence] = []
        self.steps = 0

    # ---------------------------------------------------------------------------------------- admission

    def admit(self, seq: PeerSequence) -> bool:
        """Give ``seq`` a sequence id and a sampler chain; False when all ids are taken. Raises
        ValueError when its prompt and ``max_tokens`` do not fit a sequence's context."""
        if not self.free_ids:
            return False
        if len(seq.prompt) + seq.sampling.max_tokens > self.ctx_per_sequence or len(seq.prompt) > self.max_batch // 2:
            raise ValueError(f"a prompt of {len(seq.prompt)} tokens + max_tokens {seq.sampling.max_tokens} does not fit "
                             f"the peer's {self.ctx_per_sequence}-token sequences")
        lc, s = self._lc, seq.sampling
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        if s.repetition_penalty != 1.0:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_penalties(self.n_vocab, PENALTY_WINDOW,
                                                                               s.repetition_penalty, 0.0, 0.0))
        if s.temperature <= 0:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
        else:  # in Lyre's order: temperature, then top-k, then the nucleus of what is left
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(s.temperature))
            if s.top_k:
                lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(s.top_k))
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(s.top_p, 1))
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(s.seed & 0xFFFFFFFF))
        seq._chain, seq.seq_id = chain, self.free_ids.pop()
        self.running.append(seq)
        return True

    def _release(self, seq: PeerSequence) -> None:
        self._lc.llama_memory_seq_rm(self._memory, seq.seq_id, -1, -1)
        self._lc.llama_sampler_free(seq._chain)
        seq._chain = None
        self.free_ids.append(seq.seq_id)
        self.running.remove(seq)

    # ---------------------------------------------------------------------------------------- one step

    def step(self) -> int:
        """One ``llama_decode`` over every running sequence (a new one's whole prompt, the others'
        last token), then one token sampled for each; finished and cancelled sequences leave.
        Returns the tokens generated."""
        lc, b = self._lc, self._batch
        for seq in [s for s in self.running if s.cancelled]:
            self._release(seq)
        outputs: list[tuple[PeerSequence, int]] = []
        n = 0
        for seq in self.running:
            pending = seq.prompt[seq.fed:] if seq.fed < len(seq.prompt) else seq.generated[seq.fed - len(seq.prompt):]
            if not pending or n + len(pending) > self.max_batch:
                continue  # (joins the next step)
            for j, tok in enumerate(pending):
                b.token[n], b.pos[n], b.n_seq_id[n] = tok, seq.fed + j, 1
                b.seq_id[n][0] = seq.seq_id
                b.logits[n] = j == len(pending) - 1
                n += 1
            seq.fed += len(pending)
            outputs.append((seq, n - 1))
        if not n:
            return 0
        b.n_tokens = n
        t0 = time.perf_counter()
        with LEDGER.measure("model"):
            rc = lc.llama_decode(self._ctx, b)
        # llama.cpp's other threads run (and spin) for the whole decode: their CPU, not this thread's
        LEDGER.add("model", (self.threads - 1) * (time.perf_counter() - t0))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        self.steps += 1
        for seq, i in outputs:
            with LEDGER.measure("sampling"):
                if seq.sampling.constrain_audio:
                    self._constrain(i, len(seq.generated))
                tok = lc.llama_sampler_sample(seq._chain, self._ctx, i)
            seq.generated.append(tok)
            seq.done = tok in seq.sampling.stop_ids or len(seq.generated) >= seq.sampling.max_tokens
            if seq.on_tokens is not None:
                try:
                    seq.on_tokens([tok], seq.done, None)
                except Exception:  # noqa: BLE001 - its listener is gone: this sequence ends, not the step
                    seq.done = True
        for seq, _ in outputs:
            if seq.done:
                self._release(seq)
        return len(outputs)

    def logits(self, i: int) -> np.ndarray:
        """The last step's logits of batch row ``i`` (n_vocab,): a view of llama.cpp's own buffer."""
        return np.ctypeslib.as_array(self._lc.llama_get_logits_ith(self._ctx, i), shape=(self.n_vocab,))

    def _constrain(self, i: int, k: int) -> None:
        """-inf outside the frame slot of generated token ``k`` (and end-of-speech at a boundary)."""
        logits = self.logits(i)
        lo = orpheus.AUDIO_TOKEN_OFFSET + (k % orpheus.FRAME_TOKENS) * orpheus.CODEBOOK_SIZE
        end = logits[orpheus.END_OF_SPEECH]
        logits[:lo] = -np.inf
        logits[lo + orpheus.CODEBOOK_SIZE:] = -np.inf
        if k % orpheus.FRAME_TOKENS == 0:
            logits[orpheus.END_OF_SPEECH] = end

    def close(self) -> None:
        lc = self._lc
        for seq in list(self.running):
            self._release(seq)
        if self._ctx:
            lc.llama_batch_free(self._batch)
            lc.llama_free(self._ctx)
            lc.llama_model_free(self._model)
            self._ctx = self._model = None
