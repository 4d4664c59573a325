"""The Orpheus decode step on the device: the decoder over static shapes
(:func:`lyre.engine.torch.static.static_forward`) and the audio rows' sampling
(:class:`~lyre.engine.torch.slot_sampling.SlotSampling`) as one function of fixed buffers, replayed on
a GPU as one CUDA graph per (slot bucket, length bucket), run eagerly elsewhere.

A step's inputs are six numbers per row (valid, input token, position, frame slot, tokens generated,
its uniform draw) laid out by slot on the host, in pinned memory on a GPU, and copied to the device in one transfer;
its outputs, the sampled ids of every row of the bucket and the logits they were drawn from, stay
on the device until the engine reads the whole step's ids back, once. Nothing in a decode step
depends on Python per sequence beyond filling those six numbers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from lyre.engine.torch.constrained import BAND, CONSTRAINED_COLS, col_ids
from lyre.engine.torch.cuda_graphs import Graph, GraphPool, capture
from lyre.engine.torch.llama import KVCache, Llama
from lyre.engine.torch.row_sampling import draw_bits
from lyre.engine.torch.sequence import Sequence
from lyre.engine.torch.slot_sampling import SlotSampling
from lyre.engine.torch.static import fit, length_buckets, slot_buckets, static_forward
from lyre.engine.torch.transfer import Staging, upload
from lyre.model import orpheus

log = logging.getLogger("lyre.engine")

VALID, TOKEN, POSITION, FRAME, GENERATED, DRAW = range(6)  # the rows of a step's input
FIELDS = 6


def decode_rows(model: Llama, cache: KVCache, sampling: SlotSampling, inputs: torch.Tensor, length: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step of slots 0..R-1 from ``inputs`` (6, R): their K/V written in place, attention
    over each slot's first ``length`` positions (masked to its own), a token sampled per valid row.
    Returns the ids (R,) and the recorded logits (R, 4097); a gap row's are meaningless."""
    r = inputs.shape[1]
    valid = inputs[VALID] > 0
    x = model.embed(inputs[TOKEN])  # (R, H)
    hidden = static_forward(model, cache, x, inputs[POSITION], valid, length)  # (R, H)
    return sampling.sample(model, hidden, r, valid, inputs[FRAME], inputs[GENERATED], inputs[DRAW])


@dataclass
class AudioPending:
    """Tokens of audio rows still on the device: ``cols``, the ids of a step's rows, ``rows[i]`` the row
    of ``seqs[i]`` in it; ``logits`` (rows, 4097) what they were drawn from."""

    seqs: list[Sequence]
    rows: list[int]
    cols: torch.Tensor
    logits: torch.Tensor

    def detached(self) -> AudioPending:
        """This step's outputs copied on the device (queued, nothing waits): a later replay of the graph
        overwrites the originals, and its rows may be read back after one."""
        recording = any(s.request.record_logits for s in self.seqs)
        return AudioPending(self.seqs, self.rows, self.cols.clone(), self.logits.clone() if recording else self.logits)

    def finish(self, ids: list[int]) -> tuple[list[int], list[torch.Tensor | None], list[torch.Tensor | None]]:
        """The tokens from ``ids`` (``cols`` read back), and the logits of rows that record them."""
        tokens = [ids[r] for r in self.rows]
        logits: list[torch.Tensor | None] = [None] * len(self.seqs)
        logit_ids: list[torch.Tensor | None] = [None] * len(self.seqs)
        for i, (s, r) in enumerate(zip(self.seqs, self.rows, strict=True)):
            if s.request.record_logits:
                first = orpheus.AUDIO_TOKEN_OFFSET + (s.audio_k % orpheus.FRAME_TOKENS) * BAND
                logits[i] = self.logits[r].clone()
                logit_ids[i] = col_ids(torch.arange(CONSTRAINED_COLS, device=self.logits.device), first, True)
        return tokens, logits, logit_ids


class AudioStep:
    """Runs decode steps of audio rows by :func:`decode_rows`: eagerly, or (``graphs``) by replaying the
    graph of its (slot bucket, length bucket), every graph captured by :meth:`prepare` at start."""

    def __init__(self, model: Llama, cache: KVCache, sampling: SlotSampling, graphs: bool = False):
        self.model, self.cache, self.sampling, self.graphs = model, cache, sampling, graphs
        self.staging = Staging(FIELDS, cache.slots, cache.k.device)  # graphs read its inputs[:, :R]
        self.inputs = self.staging.inputs
        self._pool = GraphPool()
        self._captured: dict[tuple[int, int], Graph] = {}
        self.steps = self.gap_rows = 0  # decode steps run, and rows run for slots that did not decode

    @property
    def slot_buckets(self) -> list[int]:
        return slot_buckets(self.cache.slots)

    @property
    def length_buckets(self) -> list[int]:
        return length_buckets(self.cache.max_seq_len)

    def key(self, seqs: list[Sequence]) -> tuple[int, int]:
        """(R, L): the slot and length buckets of a step decoding ``seqs``."""
        return (fit(max(s.slot for s in seqs) + 1, self.slot_buckets),
                fit(max(s.num_cached for s in seqs) + 1, self.length_buckets))

    def __call__(self, seqs: list[Sequence]) -> AudioPending:
        """A decode step of ``seqs`` (audio rows, each at its position ``num_cached``, fed its
        ``next_input``); their positions are not advanced here."""
        r, length = self.key(seqs)
        self.steps, self.gap_rows = self.steps + 1, self.gap_rows + r - len(seqs)
        host = self.staging.host()  # (6, slots)
        host[:] = 0
        columns = np.array([(s.slot, s.next_input, s.num_cached, s.audio_k, s.num_generated, s.seed) for s in seqs],
                           dtype=np.int64).T  # (6, N)
        slots = columns[0]
        host[VALID, slots] = 1
        host[TOKEN, slots], host[POSITION, slots] = columns[1], columns[2]
        host[FRAME, slots], host[GENERATED, slots] = columns[3] % orpheus.FRAME_TOKENS, columns[4]
        host[DRAW, slots] = draw_bits(columns[5], columns[4])
        self.staging.send()
        graph = self._captured.get((r, length))
        if graph is not None:
            ids, logits = graph.replay()
        else:
            assert not self.graphs, f"no CUDA graph for {r} slots and {length} positions (prepare() captures them all)"
            ids, logits = decode_rows(self.model, self.cache, self.sampling, self.inputs[:, :r], length)
        return AudioPending(seqs, [s.slot for s in seqs], ids, logits)

    def sample(self, seqs: list[Sequence], hidden: torch.Tensor) -> AudioPending:
        """The first token of each of ``seqs`` (audio rows whose prompt was just prefilled) from their
        normed hidden states (N, H), eagerly."""
        columns = np.array([(s.slot, s.audio_k % orpheus.FRAME_TOKENS, s.num_generated, s.seed) for s in seqs],
                           dtype=np.int64).T  # (4, N)
        host = np.concatenate([columns[:3], draw_bits(columns[3], columns[2])[None]])
        slots, frame, generated, draws = upload(torch.from_numpy(host), hidden.device)
        self.sampling.clear(slots)  # (its first token: a retried step counts it once)
        valid = torch.ones(len(seqs), dtype=torch.bool, device=hidden.device)
        ids, logits = self.sampling.sample(self.model, hidden, slots, valid, frame, generated, draws)
        return AudioPending(seqs, list(range(len(seqs))), ids, logits)

    def prepare(self) -> None:
        """Capture every (slot bucket, length bucket) graph now, at start: a capture while serving would
        hold up every stream. Raises GraphCaptureError naming the first bucket that fails."""
        self.inputs.zero_()  # (warm-up and capture see only gap rows: they change nothing)
        for r in self.slot_buckets:
            for length in self.length_buckets:
                if (r, length) not in self._captured:
                    self._captured[(r, length)] = capture(
                        lambda r=r, length=length: decode_rows(self.model, self.cache, self.sampling,
                                                               self.inputs[:, :r], length),
                        f"the decode step over {r} slots and {length} positions", self._pool)
        log.info("decode step: %d CUDA graphs captured (slots %s x positions %s)", len(self._captured),
                 self.slot_buckets, self.length_buckets)
