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
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from lyre.model.qwen3tts.config import Qwen3TTSConfig

Row = tuple[int | None, int | None]  # (text id, codec id): the row is the sum of their embeddings


@dataclass(frozen=True)
class TalkerPrompt:
    rows: tuple[Row, ...]
    trailing: tuple[int, ...]  # text ids added to the decode steps' rows in turn, then tts_pad
    max_frames: int | None = None  # the most frames its text may take (a runaway stops there)
    prefix_len: int = 0  # its first rows, which its target text does not change (instructions, role, voice)

    @property
    def prefix_key(self) -> str | None:
        """A name for its prefix rows (an engine keeps their K/V under it; requests of the same voice,
        language and instructions share it)."""
        if not self.prefix_len:
            return None
        return "rows:" + hashlib.sha256(repr(self.rows[: self.prefix_len]).encode()).hexdigest()[:24]

    def __len__(self) -> int:
        return len(self.rows)


def build_prompt(cfg: Qwen3TTSConfig, text_ids: list[int], *, speaker: str | None = None, language: str = "auto",
                 instruct_ids: list[int] | None = None, non_streaming: bool = False,
                 role_ids: list[int] | None = None, max_frames: int | None = None) -> TalkerPrompt:
    """The prompt for ``text_ids`` (the target text's tokens, no template) in a built-in ``speaker``'s
    voice (CustomVoice; None: none) and ``language`` (a name from config.json, or auto).
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
    codec_rows = [*tags, *([speaker_id] if speaker_id is not None else []), codec.pad]
    rows: list[Row] = [(i, None) for i in instruct_ids or []]
    rows += [(i, None) for i in role_ids or (text.im_start, text.assistant, text.newline)]
    rows += [(text.tts_pad, c) for c in codec_rows[:-1]] + [(text.tts_bos, codec_rows[-1])]
    prefix = len(rows)  # (every row so far: the same for any text)
    if non_streaming:
        rows += [(t, codec.pad) for t in [*text_ids, text.tts_eos]] + [(text.tts_pad, codec.bos)]
        return TalkerPrompt(tuple(rows), (), max_frames, prefix)
    rows.append((text_ids[0], codec.bos))
    return TalkerPrompt(tuple(rows), (*text_ids[1:], text.tts_eos), max_frames, prefix)
