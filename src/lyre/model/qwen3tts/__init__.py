"""The Qwen3-TTS (12 Hz) protocol: what a checkpoint's ``config.json`` says (:mod:`.config`) and the
talker's prompt rows (:mod:`.prompt`). Facts and line references: ``../shared/research/qwen3-tts.md``.

The talker is a Qwen3 decoder that never reads a token id: every prompt row and every decode step
is a sum of embedding rows (a projected text embedding, a codec embedding, or the 16 codebook
embeddings of the frame just produced). One frame (80 ms, 1920 samples at 24 kHz) is one talker
step, which samples codebook 0, then 15 dependent passes of the code predictor, which sample
codebooks 1-15.
"""

from lyre.model.qwen3tts.config import CODE_GROUPS, CODES, Qwen3TTSConfig, read_qwen3tts_config
from lyre.model.qwen3tts.prompt import XVECTOR, CloneReference, TalkerPrompt, build_prompt

__all__ = ["CODES", "CODE_GROUPS", "XVECTOR", "CloneReference", "Qwen3TTSConfig", "TalkerPrompt", "build_prompt",
           "read_qwen3tts_config"]
