"""A Qwen3-TTS generation as the engine takes it (:class:`FrameRequest`: a prompt of rows, the
talker's and the code predictor's sampling) and keeps it (:class:`FrameSequence`: the prompt's
rows and trailing text rows on the device, the codec track of its next step)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.torch.sequence import Sequence
from lyre.model.qwen3tts import Qwen3TTSConfig, TalkerPrompt

DEFAULT_MAX_FRAMES = 2048  # the reference wrapper's cap (164 s); a request's own cap follows its text (issue 31 item 5)
REPETITION_GUARD_FRAMES = 38  # 3 s of codebook 0 repeating one short cycle ends a request ("repetition")
REPETITION_MAX_PERIOD = 4  # frames: a cycle this short or shorter (one code held, or a few alternating)


@dataclass(frozen=True)
class CodeSampling:
    """The code predictor's sampling (the reference's ``subtalker_*``): no penalty, no stop, exactly 15 codes."""

    temperature: float = 0.9  # 0 = greedy
    top_k: int = 50
    top_p: float = 1.0


def talker_sampling(cfg: Qwen3TTSConfig, **overrides: Any) -> SamplingParams:
    """The reference's talker sampling (research §5): temperature 0.9, top-k 50, a 1.05 repetition
    penalty over every codebook-0 id generated, no end of speech before the second frame; stop at
    the checkpoint's ``codec_eos_token_id``."""
    base = SamplingParams(temperature=0.9, top_p=1.0, top_k=50, repetition_penalty=1.05, repetition_window=0,
                          max_tokens=DEFAULT_MAX_FRAMES, min_tokens=2, stop_ids=(cfg.codec.eos,),
                          constrain_audio=False)
    return replace(base, **overrides)


@dataclass
class FrameRequest(GenerationRequest):
    """``prompt_ids`` stays empty: the prompt is ``prompt``'s rows. ``sampling`` is the talker's
    (``max_tokens``: frames); each frame's codes arrive as one delta of 16 ids (codebooks 0-15)."""

    prompt: TalkerPrompt = field(default_factory=lambda: TalkerPrompt((), ()))
    code_sampling: CodeSampling = field(default_factory=CodeSampling)
    repetition_guard: int = REPETITION_GUARD_FRAMES  # frames; 0 = off

    def __post_init__(self) -> None:
        if self.prefix_key is None and self.prompt.prefix_len:  # (its voice's rows, shared and kept)
            self.prefix_key, self.prefix_len = self.prompt.prefix_key, self.prompt.prefix_len

    @property
    def prompt_len(self) -> int:
        return len(self.prompt.rows)

    @property
    def prefix_ids(self) -> tuple:
        return self.prompt.rows[: self.prefix_len]


@dataclass(eq=False)
class FrameSequence(Sequence):
    rows: torch.Tensor | None = None  # (L, H) the prompt's rows
    trailing: torch.Tensor | None = None  # (n, H) the trailing text's rows, one per decode step
    frame_row: torch.Tensor | None = None  # (H,) the codec track of the next decode step: its frame's 16 codes
    recent: deque[int] = field(default_factory=deque)  # the last repetition_guard frames' codebook 0

    def text_row(self, pad: torch.Tensor) -> torch.Tensor:
        """(H,) the text track of the next decode step: the next trailing text row, or tts_pad."""
        step = self.num_generated - 1  # decode steps taken so far
        return self.trailing[step] if self.trailing is not None and step < len(self.trailing) else pad

    def frame_done(self, c0: int, row: torch.Tensor) -> None:
        """A frame was made: its codebook 0 joins the penalty's history, its row is the next step's input."""
        self.num_generated += 1
        self.frame_row = row
        guard = self.request.repetition_guard
        if guard:
            self.recent.append(c0)
            if len(self.recent) > guard:
                self.recent.popleft()
        if self.params.repetition_penalty != 1.0:
            self.generated_window.append(c0)
            if self.params.repetition_window and len(self.generated_window) > self.params.repetition_window:
                self.generated_window.popleft()

    def repeating(self) -> bool:
        """Its last ``repetition_guard`` frames' codebook 0 repeat one cycle of at most
        ``REPETITION_MAX_PERIOD`` frames: a runaway (speech does not hold a cycle that long)."""
        c, guard = self.recent, self.request.repetition_guard
        if not guard or len(c) < guard:
            return False
        return any(all(c[i] == c[i - p] for i in range(p, len(c))) for p in range(1, REPETITION_MAX_PERIOD + 1))
