"""Orpheus: a Llama decoder whose audio tokens carry SNAC codes, 7 per 2048-sample frame
(:mod:`lyre.model.orpheus` is the protocol)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lyre.config import SamplingConfig
from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.model import orpheus

LANGUAGES = ("auto", "english", "en")  # Orpheus speaks English


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

    def sampling(self, config: SamplingConfig, given: dict[str, Any]) -> SamplingParams:
        """The config's ``sampling`` section with the request's overrides (a ``max_tokens`` below the
        config's ``min_tokens`` brings that down with it)."""
        if "max_tokens" in given and "min_tokens" not in given:
            given = {**given, "min_tokens": min(config.min_tokens, given["max_tokens"])}
        return SamplingParams.from_config(config, **given)

    def prompt(self, tokenizer: Any, text: str, voice: str | None, language: str | None = None,
               instructions: str | None = None) -> list[int]:
        """The prompt ids that speak ``text`` in built-in ``voice`` (None: after a cloned voice's
        reference turn). ``instructions`` are accepted and ignored (Orpheus takes no style prompt)."""
        if language is not None and language.lower() not in LANGUAGES and not language.lower().startswith("en-"):
            raise ValueError(f"'language' = {language!r}: Orpheus speaks English (auto, english, en, or en-GB and "
                             "the like: the region picks how numbers and dates are read)")
        return orpheus.build_prompt_ids(tokenizer, text, voice)

    def cloned(self, tokenizer: Any, text: str, key: str, reference: list[int], language: str | None = None,
               instructions: str | None = None) -> dict[str, Any]:
        """The voice's reference turn, then the text (no voice name); the turn is the kept prefix."""
        return dict(prompt=reference + self.prompt(tokenizer, text, None, language, instructions), prefix_key=key,
                    prefix_len=len(reference))


ORPHEUS = OrpheusFamily()
