"""The Qwen3-TTS reference implementation runs here, offline, on tiny random models built from its
own classes: what Lyre's Qwen3-TTS family is held to (issue 31). These tests pin down the facts
the parity tests rely on (``../shared/research/qwen3-tts.md``)."""

from __future__ import annotations

import torch

from tests.support.qwen_reference import reference_codes, tiny_model

TEXT = [1000 + i for i in range(7)]
OTHER = [2000 + i for i in range(12)]


def test_a_tiny_custom_voice_model_speaks_frames_of_sixteen_codes():
    model = tiny_model("custom_voice", seed=1)
    (codes,) = reference_codes(model, [TEXT], max_frames=12)
    assert codes.ndim == 2 and codes.shape[1] == 16 and 1 <= codes.shape[0] <= 12
    assert ((0 <= codes) & (codes < 2048)).all()  # codes only: control ids are suppressed, end-of-speech trimmed


def test_greedy_reference_runs_repeat_and_a_batch_equals_its_single_runs():
    model = tiny_model("custom_voice", seed=2)
    alone = [reference_codes(model, [t], max_frames=10)[0] for t in (TEXT, OTHER)]
    batch = reference_codes(model, [TEXT, OTHER], max_frames=10)  # different lengths, left padded
    again = reference_codes(model, [TEXT], max_frames=10)[0]
    assert torch.equal(again, alone[0])
    assert all(torch.equal(a, b) for a, b in zip(alone, batch, strict=True))


def test_the_base_model_builds_with_its_speaker_encoder():
    model = tiny_model("base", seed=3)
    assert model.speaker_encoder is not None and model.config.talker_config.spk_id == {}
