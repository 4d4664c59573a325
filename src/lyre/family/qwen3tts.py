"""Qwen3-TTS (12 Hz): a talker and a code predictor emitting 16 codes per 1920-sample frame
(:mod:`lyre.model.qwen3tts` is the protocol, :mod:`lyre.engine.qwen3` the engine)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.qwen3.request import CodeSampling, FrameRequest
from lyre.model.qwen3tts import CODE_GROUPS, Qwen3TTSConfig, TalkerPrompt

SAMPLES_PER_FRAME = 1920  # 80 ms at 24 kHz


class CodeFrames:
    """Deltas of codes (16 per frame, codebook 0 first) -> frames."""

    def __init__(self) -> None:
        self._held: list[int] = []

    def feed(self, ids: Sequence[int]) -> list[tuple[int, ...]]:
        self._held += ids
        n = len(self._held) // CODE_GROUPS * CODE_GROUPS
        frames = [tuple(self._held[i : i + CODE_GROUPS]) for i in range(0, n, CODE_GROUPS)]
        del self._held[:n]
        return frames


@dataclass(frozen=True)
class QwenFamily:
    cfg: Qwen3TTSConfig
    code_sampling: CodeSampling = field(default_factory=CodeSampling)
    name: str = "qwen3-tts"
    samples_per_frame: int = SAMPLES_PER_FRAME
    ids_per_frame: int = CODE_GROUPS
    ids_per_step: int = CODE_GROUPS  # a whole frame per step

    @property
    def voices(self) -> tuple[str, ...]:
        """The checkpoint's built-in speakers (CustomVoice; none for Base and VoiceDesign)."""
        return tuple(self.cfg.speakers)

    @property
    def instructions(self) -> bool:
        """VoiceDesign and 1.7B CustomVoice read a voice description; the reference drops it silently
        for 0.6B CustomVoice (research §4), so Lyre refuses it there."""
        return self.cfg.model_type == "voice_design" or (self.cfg.model_type == "custom_voice"
                                                         and self.cfg.model_size != "0b6")

    def new_parser(self) -> CodeFrames:
        return CodeFrames()

    def request(self, request_id: str, prompt: TalkerPrompt, sampling: SamplingParams, priority: int = 0,
                prefix_key: str | None = None, prefix_len: int = 0) -> GenerationRequest:
        return FrameRequest(request_id, [], sampling, priority=priority, prompt=prompt,
                            code_sampling=self.code_sampling)
