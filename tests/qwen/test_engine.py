"""Lyre's Qwen3-TTS engine (``lyre.engine.qwen3``) against QwenLM's reference implementation, on
tiny random checkpoints written by the reference itself (``save_pretrained``: the real file layout
and weight names): the same frames, code for code, greedy at both levels, in both text modes,
for a batch of texts of different lengths run together; the same penalty and end-of-speech rule;
seeded sampling that does not depend on the batch; bad requests refused without holding a slot."""

from __future__ import annotations

import contextlib

import pytest
import torch

from lyre.engine.base import GenerationRequest
from lyre.engine.qwen3.engine import QwenEngine
from lyre.engine.qwen3.request import CodeSampling, FrameRequest, talker_sampling
from lyre.engine.torch.engine import TorchEngineConfig
from lyre.model.qwen3tts import TalkerPrompt, build_prompt
from tests.support.qwen_reference import IM_END, IM_START, NEWLINE, loud_text, target_ids, tiny_model

TEXTS = ([1000 + i for i in range(7)], [2000 + i for i in range(12)], [3000, 3001, 3002])
FRAMES = 12


@pytest.fixture(scope="module")
def reference():
    return loud_text(tiny_model("custom_voice", seed=1))


@pytest.fixture(scope="module")
def engine(reference, tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-tts")
    reference.save_pretrained(path)
    return QwenEngine.from_checkpoint(path, TorchEngineConfig(slots=4, max_batch_size=4, max_seq_len=256))


def reference_frames(model, texts, speaker="vivian", language="english", non_streaming=False, frames=FRAMES,
                     penalty=1.0) -> list[torch.Tensor]:
    """The reference's greedy frames for each text, run as one left-padded batch."""
    codes, _ = model.generate(input_ids=[target_ids(t) for t in texts], languages=[language] * len(texts),
                              speakers=[speaker] * len(texts), non_streaming_mode=non_streaming,
                              max_new_tokens=frames + 1, do_sample=False, subtalker_dosample=False,
                              repetition_penalty=penalty)
    return codes


def greedy(engine, name, text, speaker="vivian", language="english", non_streaming=False, frames=FRAMES,
           penalty=1.0) -> FrameRequest:
    prompt = build_prompt(engine.talker.cfg, text, speaker=speaker, language=language, non_streaming=non_streaming)
    sampling = talker_sampling(engine.talker.cfg, temperature=0, repetition_penalty=penalty, max_tokens=frames)
    return FrameRequest(name, [], sampling=sampling, prompt=prompt, code_sampling=CodeSampling(temperature=0))


def run(engine, requests) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every request to its end: its frames (n, 16) and its finish reason."""
    for r in requests:
        assert engine.add(r)
    codes: dict[str, list[int]] = {r.request_id: [] for r in requests}
    reasons = {}
    while engine.has_work():
        for delta in engine.step():
            codes[delta.request_id] += delta.token_ids
            if delta.finished:
                reasons[delta.request_id] = delta.finish_reason
    return {k: torch.tensor(v, dtype=torch.long).view(-1, 16) for k, v in codes.items()}, reasons


@pytest.mark.parametrize("non_streaming", [False, True], ids=["streaming-text", "whole-text"])
@pytest.mark.parametrize(("speaker", "language"), [("vivian", "english"), ("eric", "auto")],
                         ids=["speaker+language", "dialect-speaker+auto"])
def test_greedy_frames_are_the_references_code_for_code(reference, engine, non_streaming, speaker, language):
    want = reference_frames(reference, TEXTS, speaker, language, non_streaming)
    got, reasons = run(engine, [greedy(engine, f"r{i}", t, speaker, language, non_streaming)
                                for i, t in enumerate(TEXTS)])
    for i in range(len(TEXTS)):
        assert got[f"r{i}"].shape == (FRAMES, 16) and reasons[f"r{i}"] == "length"
        assert torch.equal(got[f"r{i}"], want[i]), f"text {i}"
    assert not torch.equal(want[0], want[1])  # (the texts lead to different audio)


def test_the_repetition_penalty_is_the_references(reference, engine):
    plain, penalised = (reference_frames(reference, TEXTS[:1], penalty=p, frames=60)[0] for p in (1.0, 1.5))
    assert not torch.equal(plain, penalised)  # (it changes this model's frames: a code 0 comes back within 60)
    got, _ = run(engine, [greedy(engine, "p", TEXTS[0], penalty=1.5, frames=60)])
    assert torch.equal(got["p"], penalised)


def test_end_of_speech_stops_a_request_after_the_second_frame_as_in_the_reference(reference, tmp_path):
    with pointing(reference, 2150):  # end of speech is the most likely id at every step
        want = reference_frames(reference, TEXTS[:1])[0]
        reference.save_pretrained(tmp_path)
    engine = QwenEngine.from_checkpoint(tmp_path, TorchEngineConfig(slots=2, max_batch_size=2, max_seq_len=64))
    got, reasons = run(engine, [greedy(engine, "s", TEXTS[0])])
    assert want.shape == (2, 16)  # held back for two frames (min_new_tokens), then stopped
    assert torch.equal(got["s"], want) and reasons["s"] == "stop"
    assert engine.slots.free == 2


def pointing(reference, code: int):
    """A context in which every row's text track carries a large constant (the projection's bias) and
    ``code``'s codec_head row points along it: ``code`` is the most likely id at every step."""

    @contextlib.contextmanager
    def context():
        with torch.no_grad():
            bias, head = reference.talker.text_projection.linear_fc2.bias, reference.talker.codec_head.weight
            saved = bias.clone(), head.clone()
            try:
                bias.zero_()[0] = 1000.0
                head[code].zero_()[0] = 10.0
                yield
            finally:
                bias.copy_(saved[0])
                head.copy_(saved[1])

    return context()


def test_a_runaway_holding_one_code_is_stopped_by_the_repetition_guard(reference, tmp_path):
    with pointing(reference, 5):
        want = reference_frames(reference, TEXTS[:1], frames=42)[0]
        reference.save_pretrained(tmp_path)
    assert (want[:, 0] == 5).all()  # (the reference would run to its cap)
    engine = QwenEngine.from_checkpoint(tmp_path, TorchEngineConfig(slots=2, max_batch_size=2, max_seq_len=128))
    got, reasons = run(engine, [greedy(engine, "g", TEXTS[0], frames=42)])
    assert reasons["g"] == "repetition" and torch.equal(got["g"], want[:38])  # 3 s of one code 0
    unguarded = greedy(engine, "u", TEXTS[0], frames=42)
    unguarded.repetition_guard = 0
    got, reasons = run(engine, [unguarded])
    assert reasons["u"] == "length" and torch.equal(got["u"], want)


def test_a_seeded_request_makes_the_same_frames_alone_and_beside_others(engine):
    def sampled(name, text, seed):
        prompt = build_prompt(engine.talker.cfg, text, speaker="ryan", language="english")
        return FrameRequest(name, [], sampling=talker_sampling(engine.talker.cfg, seed=seed, max_tokens=8),
                            prompt=prompt)

    alone, _ = run(engine, [sampled("a", TEXTS[0], 7)])
    beside, _ = run(engine, [sampled("x", TEXTS[1], 1), sampled("a", TEXTS[0], 7), sampled("y", TEXTS[2], 2)])
    again, _ = run(engine, [sampled("a", TEXTS[0], 8)])
    assert torch.equal(alone["a"], beside["a"])
    assert not torch.equal(alone["a"], again["a"])  # (another seed: other frames)
    assert ((0 <= alone["a"]) & (alone["a"] < 2048)).all()


def test_requests_that_can_never_run_are_refused_and_hold_no_slot(engine):
    cfg = engine.talker.cfg
    good = build_prompt(cfg, TEXTS[0], speaker="vivian", language="english")
    bad = {
        "an Orpheus request": GenerationRequest("o", [1, 2, 3]),
        "an empty prompt": FrameRequest("e", [], prompt=TalkerPrompt((), ())),
        "a text id outside the vocabulary": FrameRequest("t", [], prompt=TalkerPrompt(((10**6, None),), ())),
        "a codec id outside the vocabulary": FrameRequest("c", [], prompt=TalkerPrompt(((None, 3072),), ())),
        "a row with nothing in it": FrameRequest("n", [], prompt=TalkerPrompt(((None, None),), ())),
        "a bad trailing id": FrameRequest("b", [], prompt=TalkerPrompt(good.rows, (-1,))),
        "bad sampling": FrameRequest("s", [], prompt=good, sampling=talker_sampling(cfg, top_p=0.0)),
        "bad code sampling": FrameRequest("k", [], prompt=good, code_sampling=CodeSampling(temperature=0.001)),
        "a prompt longer than a slot": FrameRequest("l", [], prompt=TalkerPrompt(good.rows * 30, ())),
    }
    for what, request in bad.items():
        with pytest.raises(ValueError):
            engine.add(request)
        assert engine.slots.free == engine.capacity, what
    for what, kwargs in {"an unknown speaker": {"speaker": "nobody"}, "an unknown language": {"language": "klingon"},
                         "": {}}.items():
        with pytest.raises(ValueError, match="speaker|language|empty"):
            build_prompt(cfg, [] if not what else TEXTS[0], **kwargs)


def test_under_a_float16_talker_the_code_predictor_stays_float32(reference, tmp_path):
    """float16 gives the code predictor NaN logits (ports that tried it): it is kept in float32."""
    reference.save_pretrained(tmp_path)
    engine = QwenEngine.from_checkpoint(tmp_path, TorchEngineConfig(slots=2, max_batch_size=2, max_seq_len=64,
                                                                    dtype=torch.float16, kv_dtype=torch.float16))
    assert engine.talker.decoder.lm_head_t.dtype == torch.float16
    assert {p.dtype for p in engine.talker.code_predictor.parameters()} == {torch.float32}
    assert engine.sampler.kv.k.dtype == torch.float32
    got, reasons = run(engine, [greedy(engine, "h", TEXTS[0], frames=6)])
    assert reasons["h"] == "length" and ((0 <= got["h"]) & (got["h"] < 2048)).all()


def test_a_sampled_run_has_the_references_logits_at_every_draw(reference, engine, monkeypatch):
    """Sampled at both levels with the reference's defaults (temperature 0.9, top-k 50, penalty 1.05):
    the reference, made to draw what Lyre drew, computes the same logits at every one of its draws
    (the talker's codebook 0 each frame, the code predictor's codebooks 1-15): the same distribution
    at every step, whatever was sampled."""
    frames = 8
    prompt = build_prompt(engine.talker.cfg, TEXTS[1], speaker="ryan", language="english")
    request = FrameRequest("s", [], sampling=talker_sampling(engine.talker.cfg, seed=11, max_tokens=frames),
                           prompt=prompt, record_logits=True)
    ours_cp: list[torch.Tensor] = []
    cp = engine.talker.code_predictor
    logits = cp.logits
    monkeypatch.setattr(cp, "logits", lambda h, j: ours_cp.append(out := logits(h, j)) or out)
    assert engine.add(request)
    codes, ours_c0 = [], []
    while engine.has_work():
        for d in engine.step():
            codes += d.token_ids
            if d.logits is not None:
                ours_c0.append(d.logits[0])
    monkeypatch.undo()
    codes = torch.tensor(codes).view(frames, 16)

    # the reference draws Lyre's codes, in the order it draws (c0 of frame 0, c1-15 of frame 0, c0 of frame 1, ...)
    forced = [int(c) for frame in codes for c in frame] + [2150]
    theirs_c0, theirs_cp = [], []
    heads = [reference.talker.codec_head, *reference.talker.code_predictor.lm_head]
    hooks = [head.register_forward_hook(lambda m, i, out, k=k: (theirs_c0 if k == 0 else theirs_cp).append(out[0, -1]))
             for k, head in enumerate(heads)]
    monkeypatch.setattr(torch, "multinomial", lambda probs, num_samples: torch.tensor([[forced.pop(0)]]))
    try:
        reference.generate(input_ids=[target_ids(TEXTS[1])], languages=["english"], speakers=["ryan"],
                           non_streaming_mode=False, max_new_tokens=frames + 1)
    finally:
        for h in hooks:
            h.remove()
    assert not forced  # every draw was one of Lyre's
    assert len(theirs_c0) == frames + 1 and len(ours_c0) == frames
    for step, (a, b) in enumerate(zip(ours_c0, theirs_c0, strict=False)):
        assert torch.allclose(a, b.float(), atol=1e-4, rtol=1e-4), f"codebook 0 of frame {step}"
    assert len(ours_cp) == len(theirs_cp) == 15 * frames
    for i, (a, b) in enumerate(zip(ours_cp, theirs_cp, strict=True)):
        assert torch.allclose(a[0], b.float(), atol=1e-4, rtol=1e-4), f"codebook {i % 15 + 1} of frame {i // 15}"


@pytest.mark.parametrize("non_streaming", [True, False], ids=["whole-text", "streaming-text"])
def test_a_voice_design_prompt_from_its_instructions_gives_the_references_frames(tmp_path, non_streaming):
    reference = tiny_model("voice_design", seed=7)
    with torch.no_grad():
        reference.talker.model.text_embedding.weight.mul_(50)  # (the instructions matter at once)
    reference.save_pretrained(tmp_path)
    engine = QwenEngine.from_checkpoint(tmp_path, TorchEngineConfig(slots=2, max_batch_size=2, max_seq_len=128))
    instruct = [IM_START, 872, NEWLINE, 4000, 4001, 4002, IM_END, NEWLINE]  # <|im_start|>user\n...<|im_end|>\n
    codes, _ = reference.generate(input_ids=[target_ids(TEXTS[0])], instruct_ids=[torch.tensor([instruct])],
                                  languages=["english"], speakers=None, non_streaming_mode=non_streaming,
                                  max_new_tokens=FRAMES + 1, do_sample=False, subtalker_dosample=False,
                                  repetition_penalty=1.0)
    prompt = build_prompt(engine.talker.cfg, TEXTS[0], language="english", instruct_ids=instruct,
                          non_streaming=non_streaming)
    sampling = talker_sampling(engine.talker.cfg, temperature=0, repetition_penalty=1.0, max_tokens=FRAMES)
    got, _ = run(engine, [FrameRequest("d", [], sampling=sampling, prompt=prompt,
                                       code_sampling=CodeSampling(temperature=0))])
    assert torch.equal(got["d"], codes[0])
    other = build_prompt(engine.talker.cfg, TEXTS[0], language="english", instruct_ids=instruct[:3] + [4999] + instruct[6:],
                         non_streaming=non_streaming)
    again, _ = run(engine, [FrameRequest("e", [], sampling=sampling, prompt=other,
                                         code_sampling=CodeSampling(temperature=0))])
    assert not torch.equal(again["e"], got["d"])  # (other instructions: another voice)


def test_a_voices_prefix_rows_are_computed_once_and_give_the_same_frames(reference, tmp_path):
    reference.save_pretrained(tmp_path)
    kept = QwenEngine.from_checkpoint(tmp_path, TorchEngineConfig(slots=2, max_batch_size=2, max_seq_len=128,
                                                                  prefix_cache_bytes=1 << 20))
    plain = QwenEngine.from_checkpoint(tmp_path, TorchEngineConfig(slots=3, max_batch_size=3, max_seq_len=128))
    requests = [greedy(kept, f"k{i}", t, non_streaming=True) for i, t in enumerate(TEXTS)]
    assert len({r.prefix_key for r in requests}) == 1 and requests[0].prefix_len == 9  # role 3 + codec prefix 6
    got = {}
    for r in requests:  # one after another: each finds the voice's prefix kept
        got.update(run(kept, [r])[0])
    prompt_rows = sum(r.prompt_len for r in requests)
    assert kept.stats().prefilled_tokens == prompt_rows - 2 * 9  # the 2nd and 3rd prefilled only their text
    want = run(plain, [greedy(plain, f"k{i}", t, non_streaming=True) for i, t in enumerate(TEXTS)])[0]
    assert all(torch.equal(got[k], want[k]) for k in want)
    other = greedy(kept, "o", TEXTS[0], speaker="eric", language="auto", non_streaming=True)
    assert other.prefix_key != requests[0].prefix_key  # another voice: other prefix rows


def test_a_fault_in_one_requests_code_prediction_ends_only_that_request(reference, engine, monkeypatch):
    """A step that raises runs again request by request: only the request whose frame cannot be made
    ends (error); the others (seeded) get exactly the frames they get without the fault, and every
    slot comes back."""
    def sampled(name: str, seed: int) -> FrameRequest:
        prompt = build_prompt(engine.talker.cfg, TEXTS[seed % 3], speaker="vivian", language="english")
        return FrameRequest(name, [], sampling=talker_sampling(engine.talker.cfg, seed=seed, max_tokens=6),
                            prompt=prompt)

    clean, _ = run(engine, [sampled("a", 1), sampled("bad", 2), sampled("b", 3)])
    predict = engine.sampler.predict

    def faulty(seqs, hidden, c0):  # (a fault of the poisoned request's own, from its third frame)
        if any(s.request.request_id == "bad" and s.num_generated >= 2 for s in seqs):
            raise RuntimeError("simulated code predictor fault")
        return predict(seqs, hidden, c0)

    monkeypatch.setattr(engine.sampler, "predict", faulty)
    got, reasons = run(engine, [sampled("a", 1), sampled("bad", 2), sampled("b", 3)])
    assert reasons == {"a": "length", "bad": "error", "b": "length"}
    assert got["bad"].shape == (2, 16) and torch.equal(got["bad"], clean["bad"][:2])
    assert torch.equal(got["a"], clean["a"]) and torch.equal(got["b"], clean["b"])
    assert engine.slots.free == engine.capacity


def test_static_decode_steps_are_the_token_engines(reference, engine, tmp_path):
    """Decode-only steps over static shapes (the CUDA graphs' code, run eagerly here): slots that do
    not decode in a step are gap rows that change nothing (a finished request's, and a live one held
    out of a few steps), a request admitted midway prefills in an ordinary step between static ones,
    and every request's frames are the ordinary engine's and the reference's."""
    reference.save_pretrained(tmp_path)
    static = QwenEngine.from_checkpoint(tmp_path, TorchEngineConfig(slots=4, max_batch_size=4, max_seq_len=256),
                                        static_decode=True)
    assert engine.static is None  # (on a CPU the engine runs the ordinary step unless asked)

    def scenario(e) -> dict[str, torch.Tensor]:
        first = [greedy(e, "a", TEXTS[0]), greedy(e, "b", TEXTS[1], frames=3), greedy(e, "c", TEXTS[2])]
        for r in first:
            assert e.add(r)
        codes: dict[str, list[int]] = {}
        steps = 0
        while e.has_work():
            held_out = 9 <= steps < 12  # (d decodes from step 7; its slot is a live gap for three steps)
            for delta in e.step(order=["a", "c"] if held_out else None):
                codes.setdefault(delta.request_id, []).extend(delta.token_ids)
            steps += 1
            if steps == 6:  # (b has finished: slot 1 is a gap; d prefills beside a, c decoding)
                assert e.add(greedy(e, "d", TEXTS[1]))
        return {k: torch.tensor(v).view(-1, 16) for k, v in codes.items()}

    want, got = scenario(engine), scenario(static)
    assert got.keys() == want.keys() == {"a", "b", "c", "d"}
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert torch.equal(got["a"], reference_frames(reference, TEXTS[:1])[0])
    assert static.static.steps > 0 and static.static.gap_rows > 0
    assert static.slots.free == 4
