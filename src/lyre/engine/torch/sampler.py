"""The sampling half of a :class:`~lyre.engine.torch.engine.TorchEngine` step: for the rows that
sample, logits over their frame slot's 4096 codes (constrained audio) or the whole vocabulary, the
repetition penalty and ``min_tokens``, then the draw (:mod:`lyre.engine.torch.sampling`); every
row's choice is read back from the device in one transfer per step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lyre.engine.torch.constrained import BAND, col_ids, constrained_logits, history_cols
from lyre.engine.torch.llama import Llama
from lyre.engine.torch.sampling import Draw, SamplingBatch, apply_repetition_penalty
from lyre.engine.torch.sampling import draw as draw_columns
from lyre.engine.torch.sequence import Sequence
from lyre.engine.torch.transfer import to_host, upload
from lyre.model import orpheus


class StepSampler:
    def __init__(self, model: Llama, device: torch.device):
        self.model, self.device = model, device

    def sample(
        self, seqs: list[Sequence], hidden: torch.Tensor
    ) -> tuple[list[int], list[torch.Tensor | None], list[torch.Tensor | None]]:
        """One token per sequence, read back from the device (:meth:`start`, then :meth:`Pending.finish`)."""
        pending = self.start(seqs, hidden)
        return pending.finish(to_host(pending.cols) if pending.cols is not None else [])

    def start(self, seqs: list[Sequence], hidden: torch.Tensor) -> Pending:
        """One token per sequence, chosen on the device and not read back: constrained rows and
        full-vocabulary rows sampled as two batches; the caller reads :attr:`Pending.cols` back with
        the rest of its step, in one transfer."""
        logits_out: list[torch.Tensor | None] = [None] * len(seqs)
        ids_out: list[torch.Tensor | None] = [None] * len(seqs)
        parts = []  # (rows, their first ids, constrained, Draw)
        constrained = [i for i, s in enumerate(seqs) if s.constrained]
        full = [i for i, s in enumerate(seqs) if not s.constrained]
        for rows, is_constrained in ((constrained, True), (full, False)):
            if not rows:
                continue
            group = [seqs[i] for i in rows]
            h = hidden[upload(rows, self.device)]
            if is_constrained:
                frame_slots = [s.audio_k % orpheus.FRAME_TOKENS for s in group]
                logits = constrained_logits(self.model, frame_slots, h)  # (n, 4097)
                first_ids = [orpheus.AUDIO_TOKEN_OFFSET + slot * BAND for slot in frame_slots]  # id of column 0
            else:
                logits = self.model.logits(h)  # (n, V)
                first_ids = [0] * len(rows)
            for j, (i, s) in enumerate(zip(rows, group, strict=True)):
                if s.request.record_logits:  # (before the draw penalises them in place)
                    logits_out[i] = logits[j].clone()
                    ids_out[i] = col_ids(torch.arange(logits.shape[1], device=self.device), first_ids[j],
                                         is_constrained)
            parts.append((rows, first_ids, is_constrained, self.draw(group, logits, first_ids, is_constrained)))
        cols = torch.cat([d.cols for *_, d in parts]) if parts else None
        return Pending(seqs, parts, cols, logits_out, ids_out)

    def draw(self, seqs: list[Sequence], logits: torch.Tensor, first_ids: list[int], constrained: bool) -> Draw:
        """Chosen column per row, on the device: repetition penalty (in place: ``logits`` is this
        step's own), min_tokens, then temperature / top-k / top-p sampling. Decided from host values
        only: nothing is read back here."""
        penalty = upload([s.params.repetition_penalty for s in seqs], self.device, torch.float32)
        logits = apply_repetition_penalty(logits, history_cols(seqs, first_ids, constrained, self.device), penalty)
        early = [j for j, s in enumerate(seqs) if s.num_generated < s.params.min_tokens]
        if early:  # min_tokens: no stop id yet
            cells = [(j, col) for j in early
                     for col in ([BAND] if constrained else [t for t in seqs[j].params.stop_ids if t < logits.shape[1]])]
            if cells:
                rows, cols = upload(cells, self.device).T
                logits = logits.index_put((rows, cols), torch.tensor(float("-inf"), device=self.device))
        params = SamplingBatch(
            temperature=[s.params.temperature for s in seqs],
            top_k=[s.params.top_k for s in seqs],
            top_p=[s.params.top_p for s in seqs],
            generators=[s.generator for s in seqs],
        )
        return draw_columns(logits, params)


@dataclass
class Pending:
    """A sampling whose choices are still on the device: ``cols`` (n,), read back by the caller."""

    seqs: list[Sequence]
    parts: list  # (rows, their first ids, constrained, Draw)
    cols: torch.Tensor | None
    logits: list[torch.Tensor | None]
    logit_ids: list[torch.Tensor | None]

    def finish(self, chosen: list[int]) -> tuple[list[int], list[torch.Tensor | None], list[torch.Tensor | None]]:
        """The tokens from ``chosen`` (``cols`` read back), and each row's recorded logits and their ids."""
        tokens: list[int] = [0] * len(self.seqs)
        at = 0
        for rows, first_ids, is_constrained, d in self.parts:
            cols = d.finish(chosen[at : at + len(rows)])
            at += len(rows)
            for i, first, col in zip(rows, first_ids, cols, strict=True):
                tokens[i] = orpheus.END_OF_SPEECH if is_constrained and col == BAND else first + col
        return tokens, self.logits, self.logit_ids


@dataclass
class Sampled:
    """A sampling already read back (a sampler that reads the device itself): nothing left to read."""

    seqs: list
    tokens: list
    logits: list
    logit_ids: list
    cols: None = None

    def finish(self, chosen: list[int]) -> tuple[list, list, list]:
        return self.tokens, self.logits, self.logit_ids


def read_back(parts: list) -> tuple[list, list, list]:
    """Every part's choices (``cols``: Pending, Sampled, AudioPending) in one read-back from the device,
    then each part finished, in order: tokens, recorded logits and their ids, part after part."""
    device_cols = [p.cols for p in parts if p.cols is not None]
    host = to_host(torch.cat(device_cols)) if device_cols else []
    tokens, logits, logit_ids = [], [], []
    at = 0
    for p in parts:
        n = 0 if p.cols is None else p.cols.shape[0]
        t, lg, ids = p.finish(host[at : at + n])
        at += n
        tokens += t
        logits += lg
        logit_ids += ids
    return tokens, logits, logit_ids
