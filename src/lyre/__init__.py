"""Lyre: a streaming text-to-speech server for Orpheus-style models."""

__version__ = "0.1.0"

__all__ = ["TTSService", "AudioChunk", "Audio", "__version__"]


def __getattr__(name: str):
    # The library API, imported on first use so `import lyre.config` stays light.
    if name in ("TTSService", "AudioChunk", "Audio"):
        from lyre.service import tts

        return getattr(tts, name)
    raise AttributeError(f"module 'lyre' has no attribute {name!r}")
