"""SNAC decoding the way Orpheus servers on llama.cpp do it (canopylabs' ``orpheus_tts`` decoder,
copied into Orpheus-FastAPI, orpheus-tts-local and most others): for the peer of ``benchmark.py
--baseline llamacpp``, not for serving.

Their stream keeps every audio code it has seen. A first chunk comes as soon as one frame (7
tokens) is in: that frame decoded alone. From then on, each time a frame completes and at least 4
are in, the last 4 frames (28 tokens) are decoded from scratch and samples 2048-4096 of the result
are kept — the second frame of the window, whose neighbours on both sides were in the decode. So
every frame after the first costs a 4-frame decode, the audio trails the tokens by two frames,
and the last two frames of an utterance are never played. (Orpheus-FastAPI's first chunk slices
2048-4096 of a one-frame decode, which is empty; here the first frame is played whole, which can
only help the peer's time to first audio.)

Lyre's codec decodes each frame once, carrying the decoder's state (``lyre.codec.stream``).
"""

from __future__ import annotations

import numpy as np
import torch

from lyre.cpu import LEDGER
from lyre.model import orpheus
from lyre.service.stream import to_int16

WINDOW_FRAMES = 4
KEEP = slice(2048, 4096)  # of the window's samples: its second frame


class SlidingWindowDecoder:
    """Frames in (7 codes each), int16 PCM out, one stream's worth."""

    def __init__(self, snac: torch.nn.Module, device: str = "cpu"):
        self._snac, self._device = snac, device
        self._frames: list[orpheus.Frame] = []
        self.decodes = 0  # SNAC calls made
        self.decoded_frames = 0  # frames those calls decoded (4 per call after the first)

    def feed(self, frames: list[orpheus.Frame]) -> list[np.ndarray]:
        """PCM chunks for ``frames`` just completed, one per frame that releases audio."""
        out = []
        for frame in frames:
            self._frames.append(frame)
            n = len(self._frames)
            if n == 1:
                out.append(self._decode(self._frames)[: orpheus.SAMPLES_PER_FRAME])
            elif n >= WINDOW_FRAMES:
                out.append(self._decode(self._frames[-WINDOW_FRAMES:])[KEEP])
        return out

    def _decode(self, frames: list[orpheus.Frame]) -> np.ndarray:
        codes = [torch.from_numpy(c)[None].to(self._device) for c in orpheus.frames_to_codes(frames)]
        with torch.inference_mode(), LEDGER.measure("codec"):
            audio = self._snac.decode(codes)[0, 0].float().cpu().numpy()  # (len(frames) * 2048,)
        self.decodes += 1
        self.decoded_frames += len(frames)
        return to_int16(audio)
