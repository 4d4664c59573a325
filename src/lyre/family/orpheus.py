"""Orpheus: a Llama decoder whose audio tokens carry SNAC codes, 7 per 2048-sample frame
(:mod:`lyre.model.orpheus` is the protocol)."""

from __future__ import annotations

from dataclasses import dataclass

from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.model import orpheus


@dataclass(frozen=True)
class OrpheusFamily:
    name: str = "orpheus"
    samples_per_frame: int = orpheus.SAMPLES_PER_FRAME
    ids_per_frame: int = orpheus.FRAME_TOKENS
    ids_per_step: int = 1
    voices: tuple[str, ...] = orpheus.VOICES
    instructions: bool = False

    def new_parser(self) -> orpheus.AudioTokenParser:
        return orpheus.AudioTokenParser()

    def request(self, request_id: str, prompt: list[int], sampling: SamplingParams, priority: int = 0,
                prefix_key: str | None = None, prefix_len: int = 0) -> GenerationRequest:
        return GenerationRequest(request_id, prompt, sampling, priority=priority, prefix_key=prefix_key,
                                 prefix_len=prefix_len)


ORPHEUS = OrpheusFamily()
