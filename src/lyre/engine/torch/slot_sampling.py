"""Sampling audio rows on the device: the frame-slot constraint, the windowed repetition penalty,
``min_tokens``, temperature, top-k and top-p, for any rows of the step, in one fixed sequence of
tensor operations that reads nothing back (so it runs inside the decode step's CUDA graph).

:class:`SlotSampling` keeps, per KV slot, what its request's sampling needs on the device: the
parameters (written once, at admission) and the tokens it has generated as bins (an audio id's offset from the first audio id, end of speech after them) with the
count of each bin inside the penalty's window. Sampling a row adds its new token to the counts and
takes out the one leaving the window, so the penalty never walks a history. Each row's uniform draw
comes with the step's inputs (:func:`lyre.engine.torch.row_sampling.draw_bits`, of its seed and count).

A row samples among its frame slot's 4096 codes (computed from the audio band of ``lm_head``: all
seven slots' bands in one product, then each row's own) plus end of speech, which only a frame
boundary and ``min_tokens`` allow: the same rule and logits as the host sampler's constrained rows
(:mod:`lyre.engine.torch.sampler`). Only requests that are constrained from their first token (their
prompt ends with start-of-speech) are sampled here.
"""

from __future__ import annotations

import torch

from lyre.engine.base import SamplingParams
from lyre.engine.torch.constrained import BAND
from lyre.engine.torch.llama import Llama
from lyre.engine.torch.row_sampling import sample_rows, uniform
from lyre.engine.torch.transfer import upload
from lyre.engine.torch.window_counts import WindowCounts
from lyre.model import orpheus

AUDIO_BINS = orpheus.FRAME_TOKENS * BAND  # bins 0..28671: the audio ids, in order
EOS_BIN = AUDIO_BINS  # end of speech
BINS = AUDIO_BINS + 1


HEAD_COLS = -(-BINS // 8) * 8  # the audio head's columns: the bins, then zeros to a multiple of 8 (aligned rows)


class SlotSampling(WindowCounts):
    """Per-slot sampling state of audio rows, on the device, allocated once: the window's counts of the
    audio bins and each slot's sampling parameters."""

    def __init__(self, slots: int, max_seq_len: int, device: torch.device, head: torch.Tensor | None = None):
        """``head``: :func:`audio_head` of the model (None: the sampler reads the model's ``lm_head``)."""
        super().__init__(slots, BINS, max_seq_len, device)

        def zeros(dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(slots + 1, dtype=dtype, device=device)

        self.temperature, self.top_p, self.penalty = zeros(torch.float32), zeros(torch.float32), zeros(torch.float32)
        self.top_k, self.min_tokens = zeros(), zeros()
        self.device, self.head = device, head

    def admit(self, slot: int, params: SamplingParams) -> None:
        """A request's sampling into ``slot`` (between steps: the copies queue before the next step's work)."""
        floats = upload(torch.tensor([params.temperature, params.top_p, params.repetition_penalty]), self.device,
                        torch.float32)
        ints = upload(torch.tensor([params.top_k, params.repetition_window, params.min_tokens]), self.device)
        for i, t in enumerate((self.temperature, self.top_p, self.penalty)):
            t[slot] = floats[i]
        for i, t in enumerate((self.top_k, self.window, self.min_tokens)):
            t[slot] = ints[i]
        self.clear(slot)

    def sample(self, model: Llama, hidden: torch.Tensor, slots: torch.Tensor | int, valid: torch.Tensor,
               frame: torch.Tensor, generated: torch.Tensor, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A token per row: ``hidden`` (R, H) normed hidden states of rows holding ``slots`` (R,) (an int
        R: slots 0..R-1), their frame slot (R,), tokens generated so far (R,) and draw
        (:func:`~lyre.engine.torch.row_sampling.draw_bits`, R); rows not ``valid`` (R,) change nothing.
        Returns the token ids (R,) and the logits a delta records (R, 4097): the slot's codes, then end
        of speech (-inf mid-frame), before the penalty and ``min_tokens``."""
        r = hidden.shape[0]
        if self.head is not None:
            scores = hidden @ self.head  # (R, HEAD_COLS) in the model's dtype
            band, eos = scores[:, :AUDIO_BINS], scores[:, AUDIO_BINS].float()
        else:
            band = model.logits(hidden, orpheus.AUDIO_TOKEN_OFFSET, AUDIO_BINS)  # (R, 7 * 4096)
            eos = model.logits_of(hidden, orpheus.END_OF_SPEECH)  # (R,)
        codes = band.unflatten(1, (orpheus.FRAME_TOKENS, BAND)).gather(1, frame.view(r, 1, 1).expand(r, 1, BAND))
        eos = eos.masked_fill(frame != 0, float("-inf"))  # (R,)
        raw = torch.cat([codes.squeeze(1).float(), eos[:, None]], dim=1)  # (R, 4097)
        bins = torch.cat([frame[:, None] * BAND + torch.arange(BAND, device=hidden.device)[None, :],
                          torch.full((r, 1), EOS_BIN, dtype=torch.long, device=hidden.device)], dim=1)  # (R, 4097)
        seen = self.seen(slots, bins)  # (R, 4097): in the row's window
        p = self.rows(self.penalty, slots)[:, None]
        logits = torch.where(seen, torch.where(raw > 0, raw / p, raw * p), raw)
        early = generated < self.rows(self.min_tokens, slots)
        logits[:, BAND].masked_fill_(early, float("-inf"))  # min_tokens: no end of speech yet
        cols = sample_rows(logits, self.rows(self.temperature, slots), self.rows(self.top_k, slots),
                           self.rows(self.top_p, slots), uniform(draws))  # (R,)
        eos_drawn = cols == BAND
        self.record(slots, valid, generated, torch.where(eos_drawn, EOS_BIN, frame * BAND + cols))
        return torch.where(eos_drawn, orpheus.END_OF_SPEECH, orpheus.AUDIO_TOKEN_OFFSET + frame * BAND + cols), raw


def audio_head(model: Llama) -> torch.Tensor:
    """(H, HEAD_COLS): the columns of ``lm_head`` for every audio id, then end of speech, then zeros, as
    one contiguous matrix whose rows are 16-byte aligned. In place, the band starts at an odd offset of
    rows 156,940 wide, which keeps the GPU's matrix product off its aligned, vectorised kernels."""
    w = model.lm_head_t
    band = w[:, orpheus.AUDIO_TOKEN_OFFSET : orpheus.AUDIO_TOKEN_OFFSET + AUDIO_BINS]
    pad = w.new_zeros(w.shape[0], HEAD_COLS - BINS)
    return torch.cat([band, w[:, orpheus.END_OF_SPEECH : orpheus.END_OF_SPEECH + 1], pad], dim=1).contiguous()
