"""Lyre's 12 Hz decoder (``lyre.codec.qwen12hz``) against QwenLM's reference decoder: the same
weights (the reference's own, loaded by name), the same audio from a full decode, and exactly
that audio again when the same codes arrive in chunks of any size, frame by frame included."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import save_file

from lyre.codec.qwen12hz import Decoder, DecoderConfig, StreamState, load_decoder
from lyre.errors import CheckpointError
from tests.support.qwen_reference import tiny_decoder, tiny_decoder_config

FRAMES = 30  # past the tiny decoder's 8-frame attention window several times
SAMPLES = 1920


@pytest.fixture(scope="module")
def decoders():
    reference = tiny_decoder(seed=4)
    ours = Decoder(DecoderConfig.from_dict(tiny_decoder_config())).eval()
    ours.load_state_dict(reference.state_dict())  # strict: every parameter, by the checkpoint's names
    return reference, ours


def codes(batch: int = 1, frames: int = FRAMES, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (batch, 16, frames), generator=torch.Generator().manual_seed(seed))


def test_a_full_decode_is_the_reference_decoders(decoders):
    reference, ours = decoders
    c = codes()
    with torch.no_grad():
        want, got = reference(c), ours.decode(c)
    assert got.shape == want.shape == (1, 1, FRAMES * SAMPLES) and ours.cfg.samples_per_frame == SAMPLES
    assert (want.abs() < 1).all() and want.std() > 1e-3  # audio, not the clamp
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decoding_as_the_codes_stream_in_gives_the_full_decode(decoders, seed):
    _, ours = decoders
    c = codes(seed=10 + seed)
    rng = random.Random(seed)
    sizes = [1] * 3 if seed == 0 else []  # frame by frame, then chunks of any size
    while sum(sizes) < FRAMES:
        sizes.append(min(rng.randint(1, 9), FRAMES - sum(sizes)))
    state, parts, at = ours.new_state(), [], 0
    with torch.no_grad():
        full = ours.decode(c)
        for n in sizes:
            part = ours.stream(c[..., at:at + n], state)
            assert part.shape[-1] == n * SAMPLES  # each chunk's own audio, at once: no lookahead
            parts.append(part)
            at += n
    streamed = torch.cat(parts, dim=-1)
    assert state.frames == [FRAMES] and (streamed - full).abs().max() <= 1e-5 * full.abs().max(), sizes


def test_a_batch_of_streams_decodes_as_each_alone(decoders):
    _, ours = decoders
    c = codes(batch=3, seed=7)
    with torch.no_grad():
        together = ours.decode(c)
        alone = torch.cat([ours.decode(c[i:i + 1]) for i in range(3)])
    assert (together - alone).abs().max() <= 1e-5 * alone.abs().max()


def test_codes_of_the_wrong_shape_are_refused(decoders):
    _, ours = decoders
    with pytest.raises(ValueError, match=r"codes must be \(batch, 16, frames\)"):
        ours.decode(torch.zeros(1, 8, 3, dtype=torch.long))


def test_streams_at_different_frames_decode_together_as_each_alone(decoders):
    """Sessions join at different times: their states stack into one batch for a round (one frame
    each, as the codec runs), and each row's audio is what that stream alone would get."""
    _, ours = decoders
    histories = [codes(frames=n, seed=20 + n) if n else None for n in (10, 0, 25)]  # (25: past the window)
    alone, stacked = [], []
    with torch.no_grad():
        for past in histories:
            state = ours.new_state()
            if past is not None:
                ours.stream(past, state)
            stacked.append(state)
            alone.append(StreamState.stack([state]).split()[0])  # (a copy to go on alone)
        together = StreamState.stack(stacked)
        assert together.frames == [10, 0, 25]
        for step in range(3):
            frame = codes(batch=3, frames=1, seed=100 + step)
            audio = ours.stream(frame, together)
            for row in range(3):
                own = ours.stream(frame[row:row + 1], alone[row])
                assert (audio[row] - own[0]).abs().max() <= 1e-5 * own.abs().max().clamp(min=1e-3)
        assert together.frames == [13, 3, 28] and [s.frames for s in together.split()] == [[13], [3], [28]]


def test_only_states_of_the_same_decoder_shape_stack_and_rows_must_match(decoders):
    _, ours = decoders
    with pytest.raises(ValueError, match="Decoder.new_state"):
        StreamState.stack([ours.new_state(), StreamState()])
    with pytest.raises(ValueError, match="2 rows of codes for a state of 1 streams"):
        ours.stream(codes(batch=2, frames=1), ours.new_state())


def speech_tokenizer_dir(path, reference, **config):
    """A checkpoint's ``speech_tokenizer/`` as published: config.json, and one safetensors file with
    the decoder's weights under ``decoder.`` beside the encoder's."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_tts_tokenizer_12hz",
                                                  "decoder_config": tiny_decoder_config(), "encoder_config": {},
                                                  "decode_upsample_rate": 1920, **config}))
    weights = {f"decoder.{k}": v.contiguous() for k, v in reference.state_dict().items()}
    weights["encoder.quantizer.fake.weight"] = torch.zeros(3)  # (the Mimi encoder's: not the decoder's)
    save_file(weights, str(path / "model.safetensors"))
    return path


def test_the_decoder_loads_from_a_speech_tokenizer_directory(decoders, tmp_path):
    reference, _ = decoders
    loaded = load_decoder(speech_tokenizer_dir(tmp_path / "speech_tokenizer", reference))
    c = codes(seed=3)
    with torch.no_grad():
        want = reference(c)
        assert (loaded.decode(c) - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("change, message", [
    ({"model_type": "mimi"}, "a 'mimi' model, not the 12 Hz speech tokenizer"),
    ({"decode_upsample_rate": 960}, "decode_upsample_rate is 960, but the decoder's upsampling makes 1920"),
    ({"decoder_config": {**tiny_decoder_config(), "latent_dim": 48}}, "decoder weights do not fit its config"),
])
def test_a_speech_tokenizer_that_does_not_fit_is_refused_naming_why(decoders, tmp_path, change, message):
    reference, _ = decoders
    with pytest.raises(CheckpointError, match=message):
        load_decoder(speech_tokenizer_dir(tmp_path / "speech_tokenizer", reference, **change))
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_decoder(tmp_path)
