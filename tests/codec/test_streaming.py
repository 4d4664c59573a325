"""The exact streaming SNAC decoder against one offline SNAC.decode (noise off)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lyre.codec.streaming import StreamingSnac, StreamingUnsupported
from lyre.model import orpheus
from tests.support.codec import F, offline, random_frames

OPEN = StreamingSnac.OPEN


@pytest.fixture(scope="module")
def streaming(quiet_snac):
    return StreamingSnac(quiet_snac).eval()


def step(model, frames, fed, end, state):
    """One call for one stream: (audio of the new frames, the new state)."""
    codes = [torch.from_numpy(c)[None] for c in orpheus.frames_to_codes(np.asarray(frames).reshape(-1, 7))]
    with torch.inference_mode():
        audio, state = model(*codes, torch.tensor([fed]), torch.tensor([end]), [], state)
    return audio[0].numpy(), state


def decode_in_pieces(model, frames, sizes):
    """Feed ``frames`` in pieces of ``sizes`` (the rest at the end), then finish with padding frames."""
    state, fed, out = model.new_state(), 0, []
    for n in [*sizes, len(frames) - sum(sizes)]:
        if n:
            audio, state = step(model, frames[fed : fed + n], fed, OPEN, state)
            out.append(audio)
            fed += n
    audio, _ = step(model, [(0,) * 7] * model.pad_frames, fed, len(frames), state)
    out.append(audio)
    return np.concatenate(out)[model.lag : model.lag + len(frames) * F]  # drop the samples before the start


def test_the_decoder_trails_the_newest_frame_by_its_lag(streaming):
    assert streaming.lag == 4757  # SNAC 24 kHz: +-9.3 latent steps of context, ~2.3 Orpheus frames
    assert streaming.pad_frames == 3
    assert streaming.state_bytes < 1_000_000  # per stream


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 12), data=st.data())
def test_any_split_of_a_stream_decodes_like_one_offline_decode(quiet_snac, streaming, n, data):
    frames = random_frames(n, seed=n)
    sizes = data.draw(st.lists(st.integers(1, 4), max_size=n).filter(lambda s: sum(s) <= n))
    ref = offline(quiet_snac, frames)
    audio = decode_in_pieces(streaming, frames, sizes)
    assert len(audio) == n * F
    assert np.abs(audio - ref).max() <= 1e-5 * np.abs(ref).max()


def test_finishing_a_copy_of_the_state_gives_the_offline_decode_of_the_frames_so_far(quiet_snac, streaming):
    frames = random_frames(6, seed=3)
    audio, state = step(streaming, frames[:4], 0, OPEN, streaming.new_state())
    tail, _ = step(streaming, [(0,) * 7] * 3, 4, 4, [s.clone() for s in state])
    so_far = np.concatenate([audio, tail])[streaming.lag : streaming.lag + 4 * F]
    ref = offline(quiet_snac, frames[:4])
    assert np.abs(so_far - ref).max() <= 1e-5 * np.abs(ref).max()
    more, _ = step(streaming, frames[4:], 4, OPEN, state)  # the original state goes on unchanged
    full = offline(quiet_snac, frames)
    exact = np.concatenate([audio, more])[streaming.lag :]
    assert np.abs(exact - full[: len(exact)]).max() <= 1e-5 * np.abs(full).max()


def test_rows_of_different_streams_in_one_call_equal_each_stream_alone(streaming):
    a, b = random_frames(5, seed=1), random_frames(5, seed=2)
    alone_a, state_a = step(streaming, a[:3], 0, OPEN, streaming.new_state())
    alone_b, state_b = step(streaming, b[:1], 0, OPEN, streaming.new_state())
    next_a, _ = step(streaming, a[3:5], 3, OPEN, state_a)
    next_b, _ = step(streaming, b[1:3], 1, 2, state_b)  # b ends after its 2nd frame: the rest is padding
    frames = np.stack([np.asarray(a[3:5]), np.asarray(b[1:3])])  # (2, 2, 7)
    codes = [torch.from_numpy(c).view(2, -1) for c in orpheus.frames_to_codes(frames.reshape(-1, 7))]
    stacked = [torch.cat([x, y]) for x, y in zip(state_a, state_b, strict=True)]
    with torch.inference_mode():
        audio, _ = streaming(*codes, torch.tensor([3, 1]), torch.tensor([OPEN, 2]), [], stacked)
    assert np.abs(audio[0].numpy() - next_a).max() < 1e-6
    assert np.abs(audio[1].numpy() - next_b).max() < 1e-6


def test_a_codec_with_attention_is_refused_with_a_clear_error():
    from snac import SNAC

    with_attention = SNAC(sampling_rate=24000, encoder_dim=8, encoder_rates=[2, 2], decoder_dim=32,
                          decoder_rates=[2, 2], attn_window_size=4, codebook_size=16, vq_strides=[4, 2, 1])
    with pytest.raises(StreamingUnsupported, match="codec.mode: window"):
        StreamingSnac(with_attention)
