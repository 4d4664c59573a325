"""Constrained audio sampling: once past start-of-speech, a request may sample only the 4096 codes
of its current frame slot, plus end-of-speech at frame boundaries. Only those rows of ``lm_head``
are computed; a constrained row's logits have 4097 columns (the slot's codes, then end-of-speech)."""

from __future__ import annotations

import torch

from lyre.engine.torch.llama import Llama
from lyre.engine.torch.sequence import Sequence
from lyre.engine.torch.transfer import upload
from lyre.model import orpheus

BAND = orpheus.CODEBOOK_SIZE  # ids per frame slot
CONSTRAINED_COLS = BAND + 1  # the slot's 4096 codes, then end-of-speech


def constrained_logits(model: Llama, frame_slots: list[int], hidden: torch.Tensor) -> torch.Tensor:
    """(n, 4097) logits: the 4096 codes of each row's frame slot (only those rows of lm_head
    are computed), then end-of-speech, masked to -inf except at frame boundaries."""
    logits = torch.empty(len(frame_slots), CONSTRAINED_COLS, device=hidden.device)
    for slot in sorted(set(frame_slots)):
        rows = upload([r for r, s in enumerate(frame_slots) if s == slot], hidden.device)
        logits[rows, :BAND] = model.logits(hidden[rows], orpheus.AUDIO_TOKEN_OFFSET + slot * BAND, BAND)
    eos = model.logits_of(hidden, orpheus.END_OF_SPEECH)  # (n,)
    mid_frame = upload([s != 0 for s in frame_slots], hidden.device, torch.bool)
    logits[:, BAND] = eos.masked_fill(mid_frame, float("-inf"))
    return logits


def col_ids(cols: torch.Tensor, first_id: int, constrained: bool) -> torch.Tensor:
    """Token ids of logits columns ``cols``: ``first_id + col``, and end-of-speech for the
    last column of constrained rows."""
    ids = first_id + cols
    if constrained:
        ids = torch.where(cols == BAND, orpheus.END_OF_SPEECH, ids)
    return ids


def history_cols(seqs: list[Sequence], first_ids: list[int], constrained: bool, device: torch.device) -> torch.Tensor:
    """(n, W) logits column of each recently generated token of each row; -1 where it has none."""
    width = max(len(s.generated_window) for s in seqs)
    if width == 0:
        return torch.empty(len(seqs), 0, dtype=torch.long, device=device)

    def col(token: int, first: int) -> int:
        if not constrained:
            return token
        if token == orpheus.END_OF_SPEECH:
            return BAND
        return token - first if 0 <= token - first < BAND else -1

    return upload([[col(t, first) for t in s.generated_window] + [-1] * (width - len(s.generated_window))
                   for s, first in zip(seqs, first_ids, strict=True)], device)
