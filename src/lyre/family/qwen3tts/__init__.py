"""Qwen3-TTS (12 Hz) as a Lyre model family: the family (:mod:`.family`), its text tokenizer as
published (:mod:`.tokenizer`) and its demo checkpoint (:mod:`.demo`)."""

from lyre.family.qwen3tts.family import CodeFrames, QwenFamily

__all__ = ["CodeFrames", "QwenFamily"]
