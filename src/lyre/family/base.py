"""What a model family tells the family-agnostic parts of Lyre.

A family's engine emits ids in :class:`~lyre.engine.base.TokenDelta` s; its :class:`FrameParser`
turns them into frames for its codec; a frame is ``samples_per_frame`` samples at 24 kHz and
takes ``ids_per_frame`` ids (the playback clock and the codec's pacing count in frames). A
segment's prompt is the family's own (a list of token ids, or rows); the family makes the
engine's request from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from lyre.config import SamplingConfig
from lyre.engine.base import GenerationRequest, SamplingParams

SAMPLE_RATE = 24000  # every family's audio (Orpheus's SNAC and Qwen3-TTS's 12 Hz codec alike)


class FrameParser(Protocol):
    def feed(self, ids: Sequence[int]) -> list[tuple[int, ...]]:
        """The frames ``ids`` (a delta's, in order) complete."""
        ...


class Family(Protocol):
    name: str  # orpheus | qwen3-tts
    samples_per_frame: int
    ids_per_frame: int  # ids a frame takes
    ids_per_step: int  # ids one engine step gives a request (Orpheus: a token; Qwen3-TTS: a frame)
    voices: tuple[str, ...]  # built-in voice names
    instructions: bool  # takes a voice description (``instructions``)

    def new_parser(self) -> FrameParser: ...

    def request(self, request_id: str, prompt: Any, sampling: SamplingParams, priority: int = 0,
                prefix_key: str | None = None, prefix_len: int = 0) -> GenerationRequest:
        """The engine's request for a segment's ``prompt``."""
        ...

    def sampling(self, config: SamplingConfig, given: dict[str, Any]) -> SamplingParams:
        """A request's sampling: the family's defaults (or the config's) with ``given`` overrides."""
        ...

    def prompt(self, tokenizer: Any, text: str, voice: str | None, language: str | None = None,
               instructions: str | None = None) -> Any:
        """A segment's prompt; ValueError naming what this family cannot honour."""
        ...

    def cloned(self, tokenizer: Any, text: str, key: str, reference: Any, language: str | None = None,
               instructions: str | None = None) -> dict[str, Any]:
        """A segment in a cloned voice (``reference``: what :mod:`lyre.service.cloning` made of it,
        kept under ``key``): its prompt and what else the segment carries (``prefix_key`` and
        ``prefix_len`` of a shared prefix the request names; ``codec_warmup``)."""
        ...
