"""The sampling half of a Qwen3-TTS step: a whole frame per sampling row, decided on the device and
read back once.

For every row that samples: codebook 0 from the talker's logits (the reference's order: repetition
penalty over the row's codebook-0 history, no end of speech before ``min_tokens`` frames, every
control id suppressed but end of speech, then temperature / top-k / top-p), then, batched across
every row (a row that drew end of speech too: its codes are dropped, and no row waits for another's
draw to be read), the code predictor's 15 dependent passes (codebooks 1-15), and the frame's summed
embedding row (the codec track of the row's next decode step). The whole frame is read back in one
transfer.

The penalty's history is kept on the device (:class:`~lyre.engine.torch.window_counts.WindowCounts`:
counts of each codebook-0 id in the window), and every draw is counter-based
(:func:`~lyre.engine.torch.row_sampling.draw_bits` of the request's seed and its frame count: stream 0
for codebook 0, 1-15 for the passes), so a seeded request makes the same frames alone or beside any
others, and a step run again after a fault draws the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lyre.engine.qwen3.model import FrameKV, Talker
from lyre.engine.qwen3.predictor import FrameLoop, RowSampling
from lyre.engine.qwen3.request import FrameSequence
from lyre.engine.torch.row_sampling import draw_bits, sample_rows, uniform
from lyre.engine.torch.transfer import to_host, upload
from lyre.engine.torch.window_counts import WindowCounts
from lyre.model.qwen3tts import CODES


@dataclass
class Frame:
    codes: list[int]  # 16 codes, codebooks 0-15
    row: torch.Tensor  # (H,) its summed embedding: the codec track of the next decode step


class FrameSampler:
    def __init__(self, model: Talker, batch: int, max_seq_len: int, device: torch.device, graphs: bool = False):
        self.model, self.device = model, device
        self.kv = FrameKV(model.cfg.code_predictor, batch, model.code_predictor.dtype, device)  # allocated once
        self.loop = FrameLoop(model, self.kv, graphs=graphs)  # one CUDA graph per batch bucket on a GPU
        vocab, eos = model.cfg.talker.vocab_size, model.cfg.codec.eos
        suppress = torch.zeros(vocab)
        suppress[CODES:] = float("-inf")  # control, language and speaker ids are never sampled...
        suppress[eos] = 0.0  # ...but end of speech
        self.suppress = suppress.to(device)  # (V,)
        self.eos = eos
        self.window = WindowCounts(batch, vocab, max_seq_len, device)  # codebook 0's penalty window, per slot

    def admit(self, seq: FrameSequence) -> None:
        """A request into its slot: an empty penalty window of its size."""
        self.window.clear(seq.slot, seq.params.repetition_window)

    def sample(self, seqs: list[FrameSequence], hidden: torch.Tensor
               ) -> tuple[list[Frame | None], list[torch.Tensor | None], list[torch.Tensor | None]]:
        """A frame per sequence (None: it sampled end of speech), and with ``record_logits`` its
        codebook-0 logits (before the penalty and the masks) and their ids."""
        if not seqs:
            return [], [], []
        assert len(seqs) <= self.kv.batch, f"{len(seqs)} frames in a step of at most {self.kv.batch}"
        logits = self.model.decoder.logits(hidden)  # (N, V) float32
        recorded = [logits[i].clone() if s.request.record_logits else None for i, s in enumerate(seqs)]
        ids = [torch.arange(logits.shape[1], device=self.device) if r is not None else None for r in recorded]
        rows = np.array([(s.slot, s.num_generated, s.params.top_k, s.params.min_tokens, s.seed) for s in seqs],
                        dtype=np.int64).T  # (5, N)
        ints = upload(torch.from_numpy(np.concatenate([rows[:4], draw_bits(rows[4], rows[1])[None]])), self.device)
        slots, made, top_k, min_frames, draws = ints
        floats = upload(torch.tensor([(s.params.temperature, s.params.top_p, s.params.repetition_penalty)
                                      for s in seqs], dtype=torch.float32), self.device)
        c0 = self._codebook0(logits, slots, made, min_frames, floats, top_k, draws)  # (N,)
        codes = self.predict(seqs, hidden, c0)  # (N, 16)
        frame_rows = self.model.frame_rows(codes)  # (N, H)
        host = to_host(codes)
        # (recorded after the read-back, the last thing that can fail: a step run again records its codes once)
        self.window.record(slots, torch.ones_like(c0, dtype=torch.bool), made, c0)
        frames = [None if row[0] == self.eos else Frame(row, frame_rows[i]) for i, row in enumerate(host)]
        return frames, recorded, ids

    def _codebook0(self, logits: torch.Tensor, slots: torch.Tensor, made: torch.Tensor, min_frames: torch.Tensor,
                   floats: torch.Tensor, top_k: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        """(N,) codebook 0 of each row, on the device: the penalty over its window, no end of speech
        before ``min_tokens`` frames, control ids suppressed, then its draw."""
        temperature, top_p, penalty = floats.T
        p = penalty[:, None]
        logits = torch.where(self.window.seen(slots), torch.where(logits > 0, logits / p, logits * p), logits)
        logits[:, self.eos].masked_fill_(made < min_frames, float("-inf"))  # min_tokens: no end of speech yet
        return sample_rows(logits + self.suppress, temperature, top_k, top_p, uniform(draws))

    def predict(self, seqs: list[FrameSequence], hidden: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
        """Codebooks 1-15 for each row: (B, 16) codes (:mod:`lyre.engine.qwen3.predictor`). ``hidden``
        (B, H): the talker's last normed hidden state; ``c0`` (B,): codebook 0."""
        rows = RowSampling.of([s.request.code_sampling for s in seqs], [s.seed for s in seqs],
                              [s.num_generated for s in seqs], self.device)
        return self.loop(hidden, c0, rows)
