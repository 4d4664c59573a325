"""Lyre: a streaming text-to-speech server for Orpheus-style models."""

__version__ = "0.1.0"
