"""Cloned voices on a Base checkpoint against QwenLM's reference implementation (issue 31 item 4):
the x-vector Lyre's speaker encoder computes, the reference codes Lyre's encoder makes, and the
frames Lyre's engine generates from them in x-vector mode and in reference-transcript mode (both
text modes; a transcript shorter and longer than its clip), code for code, greedy, for a batch of
texts of different lengths run together."""

from __future__ import annotations

import librosa
import numpy as np
import pytest
import torch

from lyre.codec.qwen12hz.encoder import ReferenceEncoder, mimi_encoder
from lyre.engine.qwen3.engine import QwenEngine
from lyre.engine.qwen3.request import CodeSampling, FrameRequest, talker_sampling
from lyre.engine.torch.engine import TorchEngineConfig
from lyre.model.qwen3tts import CloneReference, build_prompt
from lyre.model.qwen3tts.config import read_qwen3tts_config
from lyre.model.qwen3tts.speaker import load_speaker_encoder, mel_filters
from tests.qwen.test_engine import TEXTS, run
from tests.support.qwen_reference import (
    ASSISTANT,
    IM_END,
    IM_START,
    NEWLINE,
    TINY_MIMI,
    loud_text,
    target_ids,
    tiny_model,
    tiny_tokenizer,
)

FRAMES = 10


@pytest.fixture(scope="module")
def reference():
    return loud_text(tiny_model("base", seed=2))


@pytest.fixture(scope="module")
def checkpoint(reference, tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-tts-base")
    reference.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def engine(checkpoint):
    return QwenEngine.from_checkpoint(checkpoint, TorchEngineConfig(slots=4, max_batch_size=4, max_seq_len=256))


def clip(seconds: float = 1.5, seed: int = 0) -> np.ndarray:
    """A 24 kHz clip: a voiced-like buzz with noise (not silence: every encoder sees structure)."""
    t = np.arange(int(24000 * seconds)) / 24000
    rng = np.random.default_rng(seed)
    return (0.3 * np.sin(2 * np.pi * 140 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2
            + 0.02 * rng.standard_normal(len(t))).astype(np.float32)


def test_the_mel_filters_are_librosas():
    want = librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000)
    assert np.abs(mel_filters() - want).max() < 1e-7


def test_the_x_vector_is_the_references(reference, checkpoint):
    from safetensors.torch import load_file

    encoder = load_speaker_encoder(read_qwen3tts_config(checkpoint).speaker_encoder,
                                   load_file(str(checkpoint / "model.safetensors")))
    for seed, seconds in ((0, 1.5), (1, 0.7)):
        audio = clip(seconds, seed)
        want = reference.extract_speaker_embedding(audio, 24000).float().numpy()
        got = encoder.embed(audio)
        assert got.shape == want.shape == (reference.config.talker_config.hidden_size,)
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    assert np.abs(encoder.embed(clip(1.5, 0)) - encoder.embed(clip(1.5, 1))).max() > 1e-6  # (clips differ)


def test_the_reference_codes_are_the_tokenizers():
    """Lyre's encoder (transformers' Mimi encoder with the checkpoint's weights) makes the codes the
    reference tokenizer's ``encode`` makes, frames = ceil(samples / 1920)."""
    tokenizer = tiny_tokenizer(seed=3)
    ours = mimi_encoder(TINY_MIMI)
    ours.load_state_dict({k[len("encoder."):]: v for k, v in tokenizer.state_dict().items()
                          if k.startswith("encoder.")})
    encoder = ReferenceEncoder(ours.eval())
    for seconds in (1.5, 0.93):
        audio = clip(seconds)
        with torch.inference_mode():
            want = tokenizer.encode(torch.from_numpy(audio)[None], torch.ones(1, len(audio), dtype=torch.long)
                                    ).audio_codes[0].numpy()
        got = encoder.encode(audio)
        assert got.shape == want.shape == (int(np.ceil(len(audio) / 1920)), 16)
        assert np.array_equal(got, want) and len(np.unique(got)) > 16


def voice_clone_prompt(reference, xvector: np.ndarray, frames: np.ndarray | None, n: int) -> dict:
    icl = frames is not None
    return dict(ref_code=[torch.from_numpy(frames) if icl else None] * n,
                ref_spk_embedding=[torch.from_numpy(xvector)] * n,
                x_vector_only_mode=[not icl] * n, icl_mode=[icl] * n)


def reference_frames(model, texts, xvector, ref_text=None, frames=None, non_streaming=False):
    ref_ids = [torch.tensor([[IM_START, ASSISTANT, NEWLINE, *ref_text, IM_END, NEWLINE]])] * len(texts) \
        if ref_text else None
    codes, _ = model.generate(input_ids=[target_ids(t) for t in texts], ref_ids=ref_ids,
                              voice_clone_prompt=voice_clone_prompt(model, xvector, frames, len(texts)),
                              languages=["english"] * len(texts), non_streaming_mode=non_streaming,
                              max_new_tokens=FRAMES + 1, do_sample=False, subtalker_dosample=False,
                              repetition_penalty=1.0)
    return codes


CASES = {  # (reference transcript tokens, reference frames, whole text)
    "x-vector": (None, 0, False),
    "transcript-shorter-than-clip": ([500, 501, 502, 503], 20, False),
    "transcript-longer-than-clip": ([500, 501, 502, 503, 504, 505], 3, False),
    "transcript-whole-text": ([500, 501, 502], 8, True),
}


@pytest.mark.parametrize("case", CASES)
def test_cloned_frames_are_the_references_code_for_code(reference, engine, case):
    ref_text, n_frames, whole = CASES[case]
    xvector = (np.random.default_rng(5).standard_normal(reference.config.talker_config.hidden_size)
               ).astype(np.float32)
    frames = np.random.default_rng(6).integers(0, 2048, (n_frames, 16)) if ref_text else None
    want = reference_frames(reference, TEXTS, xvector, ref_text, frames, whole)
    clone = CloneReference("v_test:1", xvector, tuple(ref_text or ()),
                           tuple(tuple(int(c) for c in f) for f in frames) if frames is not None else ())
    cfg = engine.talker.cfg
    requests = [FrameRequest(f"{case}{i}", [], talker_sampling(cfg, temperature=0, repetition_penalty=1.0,
                                                               max_tokens=FRAMES),
                             prompt=build_prompt(cfg, t, language="english", non_streaming=whole, clone=clone),
                             code_sampling=CodeSampling(temperature=0)) for i, t in enumerate(TEXTS)]
    got, reasons = run(engine, requests)
    for i in range(len(TEXTS)):
        assert torch.equal(got[f"{case}{i}"], want[i]), f"text {i}"
    assert not torch.equal(want[0], want[1])
    assert engine.slots.free == engine.cfg.slots


def test_the_voice_and_its_reference_are_what_makes_the_audio(reference, engine):
    """Another x-vector, or another clip, is another voice: the engine's kept prefix of one voice is
    never served for another (their prefix keys differ)."""
    cfg, text = engine.talker.cfg, TEXTS[0]
    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal(cfg.hidden_size).astype(np.float32) for _ in range(2))
    frames = tuple(tuple(int(c) for c in f) for f in rng.integers(0, 2048, (6, 16)))
    prompts = {"a": build_prompt(cfg, text, clone=CloneReference("v_a:1", a)),
               "b": build_prompt(cfg, text, clone=CloneReference("v_b:1", b)),
               "a-ref": build_prompt(cfg, text, clone=CloneReference("v_a:2", a, (500, 501), frames))}
    assert len({p.prefix_key for p in prompts.values()}) == 3
    sampling = talker_sampling(cfg, temperature=0, repetition_penalty=1.0, max_tokens=FRAMES)
    got, _ = run(engine, [FrameRequest(k, [], sampling, prompt=p, code_sampling=CodeSampling(temperature=0))
                          for k, p in prompts.items()])
    assert not torch.equal(got["a"], got["b"]) and not torch.equal(got["a"], got["a-ref"])


def test_a_prompt_the_talker_cannot_read_is_refused_without_a_slot(engine):
    cfg = engine.talker.cfg
    wrong = CloneReference("v_w:1", np.zeros(cfg.hidden_size + 1, np.float32))
    bad_frame = CloneReference("v_f:1", np.zeros(cfg.hidden_size, np.float32), (500,), ((1,) * 15,))
    for clone, message in ((wrong, "x-vector"), (bad_frame, "16 codes")):
        request = FrameRequest("bad", [], talker_sampling(cfg), prompt=build_prompt(cfg, [1000], clone=clone))
        with pytest.raises(ValueError, match=message):
            engine.add(request)
    assert engine.slots.free == engine.cfg.slots


def test_a_transcript_longer_than_its_clip_is_read_first_and_the_cap_leaves_room_for_the_text(engine):
    """Its rest trails the clip, read a token a frame before the text: the frame cap grows by it; the
    rows (all the voice's own) are kept as a prefix but for the last, which the request computes."""
    cfg = engine.talker.cfg
    clone = CloneReference("v_l:1", np.zeros(cfg.hidden_size, np.float32), tuple(range(500, 510)),
                           ((1,) * 16,) * 3)  # 10 transcript tokens beside 4 track rows
    prompt = build_prompt(cfg, [1000, 1001], clone=clone, max_frames=41)
    assert prompt.trailing[:6] == tuple(range(504, 510)) and prompt.trailing[6:] == (1000, 1001, cfg.text.tts_eos)
    assert prompt.max_frames == 41 + 6
    assert prompt.prefix_len == len(prompt.rows) - 1
