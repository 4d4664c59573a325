"""Qwen3-TTS (12 Hz): a talker and a code predictor emitting 16 codes per 1920-sample frame
(:mod:`lyre.model.qwen3tts` is the protocol, :mod:`lyre.engine.qwen3` the engine).

A segment's prompt is its rows (:class:`~lyre.model.qwen3tts.TalkerPrompt`) in a built-in
speaker's voice (CustomVoice) or the one its instructions describe (VoiceDesign), its whole text in
the prompt as the reference's wrapper puts it for those; its frame cap follows its text: ``FRAME_CAP_BASE + FRAMES_PER_TEXT_TOKEN`` x
its text tokens (2 s plus 0.64 s a token: speech takes about 0.25 s a token, so a runaway that
misses its end of speech stops at a few times the text's length, never at the 164 s default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lyre.codec.qwen12hz.warm import WarmUp
from lyre.config import LyreConfig, SamplingConfig
from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.qwen3.request import CodeSampling, FrameRequest, talker_sampling
from lyre.errors import LyreError
from lyre.model import orpheus
from lyre.model.qwen3tts import CODE_GROUPS, CloneReference, Qwen3TTSConfig, TalkerPrompt, build_prompt

SAMPLES_PER_FRAME = 1920  # 80 ms at 24 kHz
FRAME_CAP_BASE = 25  # frames (2 s) every segment may take...
FRAMES_PER_TEXT_TOKEN = 8  # ...and this many more per token of its text (0.64 s)
MAX_INSTRUCTIONS_CHARS = 1000
# the text in the prompt whole (the reference wrapper's generate_custom_voice and generate_voice_design);
# Base clones read it one token a frame beside the audio (its generate_voice_clone)
WHOLE_TEXT = ("custom_voice", "voice_design")
DESIGNED_VOICE = "design"  # a VoiceDesign checkpoint's one built-in voice: the one its instructions describe
# BCP-47 primary language subtags -> the checkpoints' language names
LANGUAGE_CODES = {"en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ja": "japanese",
                  "fr": "french", "ko": "korean", "ru": "russian", "it": "italian", "pt": "portuguese"}
# the sampling options a request may set for the talker (max_tokens and min_tokens count frames)
REQUEST_SAMPLING = ("temperature", "top_p", "top_k", "repetition_penalty", "max_tokens", "min_tokens", "seed")


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
        """The checkpoint's built-in speakers (CustomVoice), or VoiceDesign's one voice (the one its
        instructions describe); none for Base (its voices are cloned: :meth:`cloned`)."""
        if self.cfg.model_type == "voice_design":
            return (DESIGNED_VOICE,)
        return tuple(self.cfg.speakers)

    @property
    def instructions(self) -> bool:
        """VoiceDesign and 1.7B CustomVoice read a voice description; the reference drops it silently
        for 0.6B CustomVoice (research §4), so Lyre refuses it there."""
        return self.cfg.model_type == "voice_design" or (self.cfg.model_type == "custom_voice"
                                                         and self.cfg.model_size != "0b6")

    def language_of(self, code: str) -> str:
        """The language a BCP-47 code (Riva's ``language_code``: en-US, zh-CN, ...) names, as this
        checkpoint calls it; ValueError naming the codes it takes."""
        name = LANGUAGE_CODES.get(code.split("-")[0].lower())
        if name is None or name not in self.cfg.languages:
            served = ", ".join(f"{c} ({n})" for c, n in LANGUAGE_CODES.items() if n in self.cfg.languages)
            raise ValueError(f"language_code {code!r} is not one this model speaks: {served}")
        return name

    def new_parser(self) -> CodeFrames:
        return CodeFrames()

    def request(self, request_id: str, prompt: TalkerPrompt, sampling: SamplingParams, priority: int = 0,
                prefix_key: str | None = None, prefix_len: int = 0) -> GenerationRequest:
        if prompt.max_frames is not None and prompt.max_frames < sampling.max_tokens:
            sampling = replace(sampling, max_tokens=prompt.max_frames, min_tokens=min(sampling.min_tokens,
                                                                                     prompt.max_frames))
        return FrameRequest(request_id, [], sampling, priority=priority, prompt=prompt,
                            code_sampling=self.code_sampling)  # (its prefix: the prompt's own rows)

    def sampling(self, config: SamplingConfig, given: dict[str, Any]) -> SamplingParams:
        """The reference's sampling (research §5) with the request's overrides (a ``max_tokens`` below
        the default ``min_tokens``, 2, brings that down with it); the config's ``sampling`` section is
        Orpheus's and does not apply."""
        given = {k: v for k, v in given.items() if k in REQUEST_SAMPLING}
        if "max_tokens" in given and "min_tokens" not in given:
            given["min_tokens"] = min(talker_sampling(self.cfg).min_tokens, given["max_tokens"])
        return talker_sampling(self.cfg, **given)

    def cloned(self, tokenizer: Any, text: str, key: str, reference: CloneReference, language: str | None = None,
               instructions: str | None = None) -> dict[str, Any]:
        """A Base checkpoint's segment in a cloned voice: its x-vector as the speaker row and, in
        reference-transcript mode, its transcript and frames before the text (the text read a token
        a frame, as the reference's generate_voice_clone does), the codec warmed with its frames."""
        prompt = self.prompt(tokenizer, text, None, language, instructions, clone=reference)
        warm = WarmUp(key, np.asarray(reference.frames, dtype=np.int64)) if reference.frames else None
        return dict(prompt=prompt, codec_warmup=warm)

    def text_ids(self, tokenizer: Any, text: str, what: str) -> list[int]:
        """``text``'s ids as the talker reads them (ValueError for text that spells a control token)."""
        return self._encode(tokenizer, text, what)

    def prompt(self, tokenizer: Any, text: str, voice: str | None, language: str | None = None,
               instructions: str | None = None, clone: CloneReference | None = None) -> TalkerPrompt:
        """The rows that speak ``text`` in built-in ``voice`` (or a ``clone``'s); ValueError naming a
        field this model cannot honour."""
        if self.cfg.model_type == "base" and clone is None:
            raise ValueError("this Qwen3-TTS Base checkpoint speaks cloned voices only: enroll one (POST /v1/voices) "
                             "and give its id as 'voice'")
        tag = next((t for t in orpheus.EMOTION_TAGS if t in text), None)
        if tag is not None:
            raise ValueError(f"the text has {tag}, an Orpheus emotion tag: Qwen3-TTS would read it aloud; leave it "
                             f"out, or describe the delivery in 'instructions' on a model that takes them")
        instruct_ids = None
        instructions = instructions if instructions and instructions.strip() else None  # ("": none, as the reference)
        if instructions is not None:
            if not self.instructions:
                raise ValueError(f"'instructions' is not taken by this checkpoint ({self.cfg.model_type} "
                                 f"{self.cfg.model_size}): VoiceDesign and 1.7B CustomVoice read a voice description")
            if len(instructions) > MAX_INSTRUCTIONS_CHARS:
                raise ValueError(f"'instructions' has {len(instructions)} characters; at most {MAX_INSTRUCTIONS_CHARS}")
            self._encode(tokenizer, instructions, "instructions")  # (no control token in it)
            instruct_ids = self._encode(tokenizer, f"<|im_start|>user\n{instructions}<|im_end|>\n", "instructions",
                                        template=True)
        elif self.cfg.model_type == "voice_design":
            raise ValueError("'instructions' is required: a VoiceDesign checkpoint speaks in the voice they describe")
        text_ids = self._encode(tokenizer, text, "text")
        role = self._encode(tokenizer, "<|im_start|>assistant\n", "role", template=True)
        return build_prompt(self.cfg, text_ids, speaker=voice if self.cfg.speakers else None,
                            language=language or "auto", instruct_ids=instruct_ids, role_ids=role,
                            non_streaming=self.cfg.model_type in WHOLE_TEXT, clone=clone,
                            max_frames=FRAME_CAP_BASE + FRAMES_PER_TEXT_TOKEN * len(text_ids))

    def _encode(self, tokenizer: Any, text: str, what: str, template: bool = False) -> list[int]:
        """Text ids; a caller's text that spells a special token (``<|im_end|>``) is refused."""
        ids = [int(i) for i in tokenizer.encode(text).ids]
        if not template:
            special = next((i for i in ids if i >= self.cfg.text.special_start), None)
            if special is not None:
                raise ValueError(f"the {what} spells the control token {tokenizer.id_to_token(special)!r}; leave it out")
        return ids


# OpenAI's voice names -> the CustomVoice speaker nearest in register, so clients that know only
# OpenAI's names get audio (as Orpheus's aliases do)
OPENAI_ALIASES = {"alloy": "vivian", "ash": "ryan", "ballad": "aiden", "coral": "serena", "echo": "ryan",
                  "fable": "sohee", "nova": "vivian", "onyx": "uncle_fu", "sage": "ono_anna", "shimmer": "serena",
                  "verse": "aiden", "marin": "sohee", "cedar": "dylan"}
RIVA_SUBVOICES = {"Female-1": "vivian", "Female-2": "serena", "Female-3": "sohee", "Female-4": "ono_anna",
                  "Male-1": "ryan", "Male-2": "aiden", "Male-3": "uncle_fu"}
DEFAULT_VOICES = ("vivian", "ryan")  # the default voice, when model.default_voice is not a speaker


def family_config(cfg: LyreConfig, family: QwenFamily) -> LyreConfig:
    """``cfg`` with the checkpoint's speakers as the built-in voices: ``model.voices`` left at
    Orpheus's default becomes every speaker (a list of speakers is kept; a name that is not one is
    refused), the default voice one of them, OpenAI's and Riva's names aliases of them."""
    speakers = family.voices
    m = cfg.model
    if not speakers:  # Base: cloned voices only, no default
        model = m.model_copy(update={"voices": (), "default_voice": "", "voice_aliases": {}})
        riva = cfg.riva.model_copy(update={"subvoices": {}, "voice_aliases": {}})
        return cfg.model_copy(update={"model": model, "riva": riva})
    voices = speakers if tuple(m.voices) == orpheus.VOICES else tuple(v.lower() for v in m.voices)
    unknown = [v for v in voices if v not in speakers]
    if unknown:
        raise LyreError(f"model.voices names {', '.join(unknown)}, not speakers of this checkpoint "
                        f"({', '.join(speakers)})")
    default = m.default_voice.lower() if m.default_voice.lower() in voices else \
        next((v for v in DEFAULT_VOICES if v in voices), voices[0])
    if speakers == (DESIGNED_VOICE,):  # (every OpenAI name: the voice the instructions describe)
        aliases = dict.fromkeys(OPENAI_ALIASES, DESIGNED_VOICE)
    else:
        aliases = {a: v for a, v in OPENAI_ALIASES.items() if v in voices and a not in voices}
    model = m.model_copy(update={"voices": voices, "default_voice": default, "voice_aliases": aliases})
    riva = cfg.riva.model_copy(update={"subvoices": {s: v for s, v in RIVA_SUBVOICES.items() if v in voices},
                                       "voice_aliases": {}})
    return cfg.model_copy(update={"model": model, "riva": riva})
