"""What a model family tells the family-agnostic parts of Lyre.

A family's engine emits ids in :class:`~lyre.engine.base.TokenDelta` s; its :class:`FrameParser`
turns them into frames for its codec; a frame is ``samples_per_frame`` samples at 24 kHz and
takes ``ids_per_frame`` ids (the playback clock and the codec's pacing count in frames). A
segment's prompt is the family's own (a list of token ids, or rows); the family makes the
engine's request from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.errors import CheckpointError
from lyre.model.checkpoint import read_config_json

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


FAMILIES = {"llama": "orpheus", "qwen3_tts": "qwen3-tts"}  # config.json model_type -> family


def family_of(model_dir: str | Path) -> str:
    """The family of the checkpoint in ``model_dir``, read from its config.json's ``model_type``."""
    model_type = read_config_json(model_dir).get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(f"{Path(model_dir) / 'config.json'}: model_type {model_type!r} is not a family Lyre "
                              f"serves ({', '.join(f'{v} ({k})' for k, v in FAMILIES.items())})")
    return FAMILIES[model_type]
