"""Random frames, one offline decode (the reference every streamed decode must match), and feeding a codec."""

from __future__ import annotations

import numpy as np
import torch

from lyre.model import orpheus

F = orpheus.SAMPLES_PER_FRAME


def random_frames(n: int, seed: int) -> list[orpheus.Frame]:
    rng = np.random.default_rng(seed)
    return [tuple(int(x) for x in rng.integers(0, 4096, 7)) for _ in range(n)]


def offline(snac, frames) -> np.ndarray:
    """One ``SNAC.decode`` of all ``frames``: the reference every streamed decode must match."""
    codes = [torch.from_numpy(c)[None] for c in orpheus.frames_to_codes(frames)]
    with torch.inference_mode():
        return snac.decode(codes)[0, 0].numpy()


def feed(codec, frames, settings, arrivals: list[int], chunk_frames: int | None = None, need_audio: bool = True):
    """Push ``frames`` in groups of ``arrivals`` sizes into a new stream of ``codec``, decoding every
    job due after each group (for a listener that always ``need_audio``: every chunk as soon as it
    can be emitted); then finish and decode the rest. Returns (chunks, stream)."""
    stream = codec.new_stream(settings)
    chunk_frames = chunk_frames or settings.every_flush_frames
    chunks, i = [], 0

    def drain():
        while (job := stream.plan(chunk_frames, need_audio)) is not None:
            chunks.append(stream.complete(job, codec.decode([job])[0]))

    for n in arrivals:
        stream.push(frames[i : i + n])
        i += n
        drain()
    stream.push(frames[i:])
    stream.finish()
    drain()
    return chunks, stream
