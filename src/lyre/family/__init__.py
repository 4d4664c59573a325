"""Model families: everything that differs between the model families Lyre serves, behind one
interface (:class:`~lyre.family.base.Family`), so that the scheduler, sessions, playback clock,
admission, the APIs, accounts, audit, watermark, metrics and benchmark never ask which one runs.

- :mod:`lyre.family.base`: the interface (frame rule, prompts, requests, sampling defaults, voices);
- :mod:`lyre.family.orpheus`: Orpheus (a Llama emitting 7 SNAC tokens per 2048-sample frame);
- :mod:`lyre.family.qwen3tts`: Qwen3-TTS 12 Hz (a talker and code predictor emitting 16 codes per
  1920-sample frame).

:func:`lyre.model.checkpoint.checkpoint_family` reads a checkpoint's family from its
``config.json`` (``model_type``), never from its name.
"""

from lyre.family.base import Family, FrameParser
from lyre.family.orpheus import ORPHEUS

__all__ = ["ORPHEUS", "Family", "FrameParser"]
