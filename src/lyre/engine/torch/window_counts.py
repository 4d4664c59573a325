"""The repetition penalty's window on the device: per KV slot, the bins of the tokens it generated and
how many times each bin is among its last ``window`` of them (all of them for a window of 0).

Recording a row's new token adds it to the counts and takes out the one leaving the window (read from
the history), so a step never walks a history: the penalty reads ``counts[slot] > 0``. Rows that do
not record this step (``valid`` false) change nothing; a spare row (:attr:`scratch`) may be named by
rows that belong to no slot. Allocated once; owned by the engine thread.
"""

from __future__ import annotations

import torch


class WindowCounts:
    def __init__(self, slots: int, bins: int, max_seq_len: int, device: torch.device):
        self.scratch = slots  # one row more than the slots: what rows of no slot name
        self.window = torch.zeros(slots + 1, dtype=torch.long, device=device)  # its request's window (0: all)
        self.history = torch.zeros(slots + 1, max_seq_len, dtype=torch.long, device=device)  # bin of each token made
        self.counts = torch.zeros(slots + 1, bins, dtype=torch.int32, device=device)  # of each bin in the window
        self.bins = bins

    @staticmethod
    def rows(t: torch.Tensor, slots: torch.Tensor | int) -> torch.Tensor:
        """``t``'s rows of ``slots``: the first R as a view for an int R, else gathered."""
        return t[:slots] if isinstance(slots, int) else t[slots]

    def clear(self, slots: torch.Tensor | int, window: int | None = None) -> None:
        """Empty the windows of ``slots`` (a slot's index or a tensor of them), and set a slot's size."""
        if isinstance(slots, int):
            self.counts[slots].zero_()
            if window is not None:
                self.window[slots] = window
        else:
            self.counts.index_fill_(0, slots, 0)

    def seen(self, slots: torch.Tensor | int, bins: torch.Tensor | None = None) -> torch.Tensor:
        """(R, C) whether each of ``bins`` (R, C; None: every bin) is in its row's window."""
        counts = self.rows(self.counts, slots)
        return (counts if bins is None else counts.gather(1, bins)) > 0

    def record(self, slots: torch.Tensor | int, valid: torch.Tensor, generated: torch.Tensor, new: torch.Tensor
               ) -> None:
        """Token number ``generated`` of each valid row is bin ``new``: into its history and its window's
        counts, and the token ``window`` places back out of them."""
        index = torch.arange(slots, device=new.device) if isinstance(slots, int) else slots
        flat = self.counts.view(-1)
        base = index * self.bins
        flat.scatter_add_(0, base + new, valid.int())
        window = self.rows(self.window, slots)
        old = generated - window
        leaves = valid & (window > 0) & (old >= 0)
        flat.scatter_add_(0, base + self.history[index, old.clamp(min=0)], -leaves.int())
        at = (index, generated.clamp(max=self.history.shape[1] - 1))
        self.history[at] = torch.where(valid, new, self.history[at])
