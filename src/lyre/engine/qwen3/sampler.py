"""The sampling half of a Qwen3-TTS step: a whole frame per sampling row.

For every row that samples: codebook 0 from the talker's logits (the reference's order: repetition
penalty over the row's codebook-0 history, no end of speech before ``min_tokens`` frames, every
control id suppressed but end of speech, then temperature / top-k / top-p), then, batched across
every row that did not stop, the code predictor's 15 dependent passes (codebooks 1-15), and the
frame's summed embedding row (the codec track of the row's next decode step).

Each row draws from its own generator a fixed number of values per draw, whatever the batch holds,
so a seeded request makes the same frames alone or beside any others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lyre.engine.qwen3.model import FrameKV, Talker
from lyre.engine.qwen3.predictor import FrameLoop, RowSampling
from lyre.engine.qwen3.request import FrameSequence
from lyre.engine.torch.constrained import history_cols
from lyre.engine.torch.sampling import SamplingBatch, apply_repetition_penalty, draw
from lyre.engine.torch.transfer import to_host, upload
from lyre.model.qwen3tts import CODES


@dataclass
class Frame:
    codes: list[int]  # 16 codes, codebooks 0-15
    row: torch.Tensor  # (H,) its summed embedding: the codec track of the next decode step


class FrameSampler:
    def __init__(self, model: Talker, batch: int, device: torch.device, graphs: bool = False):
        self.model, self.device = model, device
        self.kv = FrameKV(model.cfg.code_predictor, batch, model.code_predictor.dtype, device)  # allocated once
        self.loop = FrameLoop(model, self.kv, graphs=graphs)  # one CUDA graph per batch bucket on a GPU
        vocab, eos = model.cfg.talker.vocab_size, model.cfg.codec.eos
        suppress = torch.zeros(vocab)
        suppress[CODES:] = float("-inf")  # control, language and speaker ids are never sampled...
        suppress[eos] = 0.0  # ...but end of speech
        self.suppress = suppress.to(device)  # (V,)
        self.eos = eos

    def sample(self, seqs: list[FrameSequence], hidden: torch.Tensor
               ) -> tuple[list[Frame | None], list[torch.Tensor | None], list[torch.Tensor | None]]:
        """A frame per sequence (None: it sampled end of speech), and with ``record_logits`` its
        codebook-0 logits (before the penalty and the masks) and their ids."""
        if not seqs:
            return [], [], []
        logits = self.model.decoder.logits(hidden)  # (N, V) float32
        recorded = [logits[i].clone() if s.request.record_logits else None for i, s in enumerate(seqs)]
        ids = [torch.arange(logits.shape[1], device=self.device) if r is not None else None for r in recorded]
        c0 = self._codebook0(seqs, logits)
        go = [i for i, c in enumerate(c0) if c != self.eos]
        frames: list[Frame | None] = [None] * len(seqs)
        for start in range(0, len(go), self.kv.batch):  # (at most the buffer's rows per pass)
            rows = go[start : start + self.kv.batch]
            codes = self.predict([seqs[i] for i in rows], hidden[upload(rows, self.device)],
                                 upload([c0[i] for i in rows], self.device))  # (B, 16)
            frame_rows = self.model.frame_rows(codes)  # (B, H)
            for j, (i, row_codes) in enumerate(zip(rows, to_host(codes), strict=True)):
                frames[i] = Frame(row_codes, frame_rows[j])
        return frames, recorded, ids

    def _codebook0(self, seqs: list[FrameSequence], logits: torch.Tensor) -> list[int]:
        penalty = upload([s.params.repetition_penalty for s in seqs], self.device, torch.float32)
        logits = apply_repetition_penalty(logits, history_cols(seqs, [0] * len(seqs), False, self.device), penalty)
        early = [j for j, s in enumerate(seqs) if s.num_generated < s.params.min_tokens]
        if early:  # min_tokens: no end of speech yet
            logits[upload(early, self.device), self.eos] = float("-inf")
        logits += self.suppress
        params = SamplingBatch([s.params.temperature for s in seqs], [s.params.top_k for s in seqs],
                               [s.params.top_p for s in seqs], [s.generator for s in seqs])
        d = draw(logits, params)
        return d.finish(to_host(d.cols))

    def predict(self, seqs: list[FrameSequence], hidden: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
        """Codebooks 1-15 for each row: (B, 16) codes (:mod:`lyre.engine.qwen3.predictor`). ``hidden``
        (B, H): the talker's last normed hidden state; ``c0`` (B,): codebook 0."""
        rows = RowSampling.of([s.request.code_sampling for s in seqs], [s.generator for s in seqs], self.device)
        return self.loop(hidden, c0, rows)
