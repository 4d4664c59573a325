"""Lyre: a streaming text-to-speech server for Orpheus-style models.

The library API: ``lyre.TTSService`` (text in, streaming 24 kHz PCM out), the ``SpeechStream`` and
``Utterance`` it gives back, their ``AudioChunk`` s and the whole-utterance ``Audio``. The errors
they raise are in :mod:`lyre.errors`.
"""

__version__ = "0.1.0"

__all__ = ["TTSService", "SpeechStream", "Utterance", "AudioChunk", "Audio", "__version__"]

_HOMES = {"TTSService": "lyre.service.tts", "SpeechStream": "lyre.service.stream", "AudioChunk": "lyre.service.stream",
          "Audio": "lyre.service.stream", "Utterance": "lyre.service.utterance"}


def __getattr__(name: str):
    # imported on first use, so that `import lyre.config` does not load torch
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'lyre' has no attribute {name!r}")
