"""The talker's prompt: one row per position, each the sum of a text-track embedding and a
codec-track embedding (either may be absent), and the trailing text fed one token per frame after
the prompt (research §2, §4; the reference's ``generate``, M:2076-2232).

Row layout, for a target text of tokens t1..tn:

- instruct rows (text only; VoiceDesign, 1.7B CustomVoice): ``<|im_start|>user\\n{instruct}<|im_end|>\\n``;
- role rows (text only): ``<|im_start|>assistant\\n``;
- codec prefix: [think, think_bos, language, think_eos] ([nothink, think_bos, think_eos] for
  ``auto``), the speaker, then codec_pad, each paired with tts_pad except codec_pad with tts_bos;
- streaming text (the reference's default for ``generate``): one row t1 + codec_bos; the trailing
  text is t2..tn then tts_eos, and tts_pad once it has run out;
- non-streaming text: (t1..tn, tts_eos) each + codec_pad, then tts_pad + codec_bos; nothing trails.

A cloned voice (Base checkpoints, :class:`CloneReference`) has its x-vector as the speaker row;
in reference-transcript mode the rows after the codec prefix pair a text track of [its
transcript's tokens, t1..tn, tts_eos] with a codec track of [codec_bos, its clip's frames]: zipped
row by row when the text streams (text left over trails; a shorter text is padded with tts_pad),
or the whole text + codec_pad, then the codec track + tts_pad (M:1968-2019, 2188-2197).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from lyre.model.qwen3tts.config import Qwen3TTSConfig

XVECTOR = "x-vector"  # a codec track that is the prompt's speaker embedding (a cloned voice)
# a codec track: an id of the codec vocabulary, a frame's 16 codes (their embeddings summed, as a
# decode step's), or XVECTOR
Codec = int | tuple[int, ...] | str
Row = tuple[int | None, Codec | None]  # (text id, codec track): the row is the sum of their embeddings


@dataclass(frozen=True)
class CloneReference:
    """A cloned voice as its prompts read it: its clip's x-vector and, in reference-transcript mode,
    the transcript's text ids (no template) and the clip's frames."""

    key: str  # names the voice and its reference (its prompts' shared rows are kept under it)
    xvector: np.ndarray = field(repr=False, compare=False)  # (talker hidden,) float32
    text_ids: tuple[int, ...] = ()  # empty: x-vector mode
    frames: tuple[tuple[int, ...], ...] = field(default=(), repr=False)  # (T, 16) codes, codebook 0 first


@dataclass(frozen=True)
class TalkerPrompt:
    rows: tuple[Row, ...]
    trailing: tuple[int, ...]  # text ids added to the decode steps' rows in turn, then tts_pad
    max_frames: int | None = None  # the most frames its text may take (a runaway stops there)
    prefix_len: int = 0  # its first rows, which its target text does not change (instructions, role, voice)
    speaker: np.ndarray | None = field(default=None, repr=False, compare=False)  # (H,) the XVECTOR row
    voice_key: str = ""  # the cloned voice its speaker row and reference rows are

    @property
    def prefix_key(self) -> str | None:
        """A name for its prefix rows (an engine keeps their K/V under it; requests of the same voice,
        language and instructions share it)."""
        if not self.prefix_len:
            return None
        digest = hashlib.sha256(repr((self.voice_key, self.rows[: self.prefix_len])).encode()).hexdigest()[:24]
        # (a clone's starts with its voice's key "<voice id>:...": dropped with the voice)
        return f"{self.voice_key}:rows:{digest}" if self.voice_key else f"rows:{digest}"

    def __len__(self) -> int:
        return len(self.rows)


def build_prompt(cfg: Qwen3TTSConfig, text_ids: list[int], *, speaker: str | None = None, language: str = "auto",
                 instruct_ids: list[int] | None = None, non_streaming: bool = False,
                 role_ids: list[int] | None = None, max_frames: int | None = None,
                 clone: CloneReference | None = None) -> TalkerPrompt:
    """The prompt for ``text_ids`` (the target text's tokens, no template) in a built-in ``speaker``'s
    voice (CustomVoice; None: none) or a ``clone``'s, and ``language`` (a name from config.json, or auto).
    ``instruct_ids``: the whole tokenized instruct template; ``role_ids``: ``<|im_start|>assistant\n``
    as the tokenizer reads it (default: Qwen's ids). ValueError names what cannot be honoured."""
    if not text_ids:
        raise ValueError("the text is empty")
    language = language.lower()
    if language != "auto" and language not in cfg.languages:
        raise ValueError(f"language {language!r} is not one this model speaks ({', '.join(['auto', *cfg.languages])})")
    codec, text = cfg.codec, cfg.text
    language_id = cfg.languages.get(language)
    speaker_id = None
    if speaker is not None:
        speaker = speaker.lower()
        if speaker not in cfg.speakers:
            known = ", ".join(cfg.speakers) or "none: this checkpoint has no built-in speakers"
            raise ValueError(f"speaker {speaker!r} is not one of this model's ({known})")
        speaker_id = cfg.speakers[speaker]
        if language in ("chinese", "auto") and speaker in cfg.dialects:  # a dialect speaker speaks its dialect
            language_id = cfg.languages[cfg.dialects[speaker]]
    tags = ([codec.nothink, codec.think_bos, codec.think_eos] if language_id is None
            else [codec.think, codec.think_bos, language_id, codec.think_eos])
    if clone is not None:
        speaker_id = XVECTOR
    codec_rows = [*tags, *([speaker_id] if speaker_id is not None else []), codec.pad]
    rows: list[Row] = [(i, None) for i in instruct_ids or []]
    rows += [(i, None) for i in role_ids or (text.im_start, text.assistant, text.newline)]
    rows += [(text.tts_pad, c) for c in codec_rows[:-1]] + [(text.tts_bos, codec_rows[-1])]
    prefix = len(rows)  # (every row so far: the same for any text)
    voice = dict(speaker=clone.xvector, voice_key=clone.key) if clone is not None else {}
    if clone is not None and clone.text_ids:
        return _reference_rows(cfg, rows, text_ids, clone, non_streaming, max_frames, voice)
    if non_streaming:
        rows += [(t, codec.pad) for t in [*text_ids, text.tts_eos]] + [(text.tts_pad, codec.bos)]
        return TalkerPrompt(tuple(rows), (), max_frames, prefix, **voice)
    rows.append((text_ids[0], codec.bos))
    return TalkerPrompt(tuple(rows), (*text_ids[1:], text.tts_eos), max_frames, prefix, **voice)


def _reference_rows(cfg: Qwen3TTSConfig, rows: list[Row], text_ids: list[int], clone: CloneReference,
                    non_streaming: bool, max_frames: int | None, voice: dict) -> TalkerPrompt:
    """Reference-transcript mode: the transcript and the target text beside the clip's frames. The
    transcript's rows are the same for any target text: they join the prefix."""
    text = [*clone.text_ids, *text_ids, cfg.text.tts_eos]
    track: list[Codec] = [cfg.codec.bos, *clone.frames]
    shared = len(rows) + len(clone.text_ids)  # (the streaming zip pairs them with the track's first rows)
    if non_streaming:
        rows += [(t, cfg.codec.pad) for t in text] + [(cfg.text.tts_pad, c) for c in track]
        return TalkerPrompt(tuple(rows), (), max_frames, shared, **voice)
    n = min(len(text), len(track))
    rows += list(zip(text[:n], track[:n], strict=True)) + [(cfg.text.tts_pad, c) for c in track[n:]]
    # (a transcript longer than its clip trails the clip: its rest is read before the text, a
    # token a frame, so the cap grows by it; the prefix leaves the last row to the request)
    rest = max(0, len(clone.text_ids) - n)
    cap = max_frames + rest if max_frames is not None else None
    return TalkerPrompt(tuple(rows), tuple(text[n:]), cap, min(shared, len(rows) - 1), **voice)
