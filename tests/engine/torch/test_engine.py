"""TorchEngine behaviour: slots, the caller's decode order, prefill, cancellation, errors, seeds, the
audio constraint."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.model import orpheus
from tests.support.engines import drive, make_engine, poison, tokens_of

AUDIO_PROMPT = [orpheus.START_OF_HUMAN, orpheus.BOS, 500, 501, 502, *orpheus.PROMPT_SUFFIX]


def speech_prompt(i: int, extra: int = 0) -> list[int]:
    return [orpheus.START_OF_HUMAN, orpheus.BOS, *range(300 + i, 303 + i + extra), *orpheus.PROMPT_SUFFIX]


@pytest.fixture(scope="module")
def engine(demo_dir):
    return make_engine(demo_dir / "llama", slots=4, max_batch_size=4, max_prefill_tokens=16, max_seq_len=128)


def test_kv_cache_is_allocated_once_and_slots_come_back(engine):
    k_ptr, v_ptr = engine.cache.k.data_ptr(), engine.cache.v.data_ptr()
    assert engine.stats().kv_cache_bytes == engine.cache.nbytes
    params = SamplingParams(max_tokens=5, seed=1)
    arrivals = {i: [GenerationRequest(f"s{i}", speech_prompt(i), params)] for i in range(12)}
    seen_active = []
    out = drive(engine, arrivals, lambda step, d: seen_active.append(engine.stats().active))
    assert max(seen_active) == 4  # never more than the slots
    assert all(out[f"s{i}"][-1].finish_reason == "length" and len(tokens_of(out[f"s{i}"])) == 5 for i in range(12))
    assert (engine.cache.k.data_ptr(), engine.cache.v.data_ptr()) == (k_ptr, v_ptr)
    assert engine.stats().active == 0 and not engine.has_work()
    assert engine.slots.free == 4 and not engine.slots.by_id  # nothing kept per finished request


def test_add_takes_the_lowest_free_slot_at_once_or_refuses_and_keeps_nothing(engine):
    params = SamplingParams(max_tokens=50, seed=2)
    assert all(engine.add(GenerationRequest(f"busy{i}", speech_prompt(i), params)) for i in range(4))
    assert sorted(s.slot for s in engine.slots.by_slot.values()) == [0, 1, 2, 3]  # slots taken in add(), before any step
    before = engine.stats()
    assert engine.add(GenerationRequest("late", speech_prompt(5), params)) is False
    with pytest.raises(ValueError, match="empty"):  # a request that can never run is still refused as such
        engine.add(GenerationRequest("bad", [], params))
    after = engine.stats()
    assert (after.active, after.waiting, after.total_requests) == (4, 0, before.total_requests)
    assert "late" not in engine.slots.by_id
    assert "late" not in {d.request_id for d in engine.step()}
    engine.cancel("busy2")
    engine.cancel("busy0")
    engine.step()  # frees slots 0 and 2
    assert engine.add(GenerationRequest("late", speech_prompt(5), params))  # the same id again: nothing was kept
    assert engine.slots.by_id["late"].slot == 0
    for i in (1, 3):
        engine.cancel(f"busy{i}")
    engine.cancel("late")
    engine.step()
    assert not engine.has_work() and engine.slots.free == 4


def test_prompts_prefill_by_priority_then_admission_order(engine):
    params = SamplingParams(max_tokens=3, seed=2)
    low, high = speech_prompt(5, extra=3), speech_prompt(6, extra=3)  # 12 tokens each; the budget is 16
    engine.add(GenerationRequest("low", low, params, priority=0))
    engine.add(GenerationRequest("high", high, params, priority=5))
    assert [d.request_id for d in engine.step()] == ["high"]  # high's whole prompt, then 4 of low's
    assert engine.stats().prefilling == 1
    assert "low" in {d.request_id for d in engine.step()}
    drive(engine, {})


def test_order_decides_who_decodes_when_more_are_ready_than_the_batch(demo_dir):
    eng = make_engine(demo_dir / "llama", slots=4, max_batch_size=2, max_prefill_tokens=64)
    for rid in "abcd":
        assert eng.add(GenerationRequest(rid, speech_prompt(ord(rid)),
                                         SamplingParams(max_tokens=20, min_tokens=20, seed=1)))
    assert sorted(d.request_id for d in eng.step(order=[])) == ["a", "b", "c", "d"]  # prefill ignores the order

    def decoded(order):
        return [d.request_id for d in eng.step(order)]

    assert decoded(["d", "b", "a", "c"]) == ["d", "b"]  # the first max_batch_size of the order
    assert decoded(["no-such", "c", "c", "also-unknown"]) == ["c"]  # unknown ids ignored, duplicates once
    assert decoded(None) == ["a", "b"]  # no order: earliest admitted first
    assert decoded([]) == []
    eng.cancel("a")
    assert sorted(decoded(["a", "c", "d"])) == ["a", "c", "d"]  # a's cancellation; c and d decode
    while eng.has_work():
        eng.step(["b", "c", "d"])


def test_a_request_not_in_the_order_still_prefills_and_samples_its_first_token(engine):
    params = SamplingParams(max_tokens=30, min_tokens=30, seed=4)
    engine.add(GenerationRequest("talker", speech_prompt(0), params))
    engine.step()
    long_prompt = speech_prompt(1, extra=30)  # 39 tokens: 3 steps of the 16-token budget
    engine.add(GenerationRequest("long", long_prompt, params))
    seen = [[d.request_id for d in engine.step(["talker"])] for _ in range(3)]
    assert seen == [["talker"], ["talker"], ["talker", "long"]]  # long's first token when its prefill ends
    assert [d.request_id for d in engine.step(["talker"])] == ["talker"]  # ready, but not in the order
    assert [d.request_id for d in engine.step(["long"])] == ["long"]
    engine.cancel("talker")
    engine.cancel("long")
    engine.step()
    assert not engine.has_work()


def test_a_batch_items_prompt_prefills_only_in_steps_whose_order_lists_it(engine):
    params = SamplingParams(max_tokens=3, min_tokens=3, seed=5)
    engine.add(GenerationRequest("batch", speech_prompt(2), params, priority=-1))
    engine.add(GenerationRequest("live", speech_prompt(3), params, priority=1))
    assert [d.request_id for d in engine.step(["live"])] == ["live"]  # live's prompt alone: batch waits
    assert engine.stats().prefilling == 1
    assert [d.request_id for d in engine.step(["live"])] == ["live"]
    assert engine.stats().prefilling == 1  # still not prefilled
    assert "batch" in {d.request_id for d in engine.step(["live", "batch"])}  # listed: it prefills
    drive(engine, {})


def test_several_prompts_prefill_in_one_forward(engine):
    params = SamplingParams(max_tokens=2, seed=3)
    for i in range(3):  # 3 x 4 tokens fit the 16-token prefill budget
        engine.add(GenerationRequest(f"p{i}", [orpheus.START_OF_HUMAN, orpheus.BOS, 300 + i, orpheus.START_OF_SPEECH],
                                     params))
    first = engine.step()
    assert sorted(d.request_id for d in first) == ["p0", "p1", "p2"]  # each sampled its first token
    assert engine.stats().total_steps >= 1
    while engine.has_work():
        engine.step()


def test_a_long_prompt_is_chunked_and_never_stalls_decoding(engine):
    params = SamplingParams(max_tokens=30, seed=4)
    engine.add(GenerationRequest("talker", speech_prompt(0), params))
    engine.step()  # talker prefilled and decoding
    long_prompt = speech_prompt(1, extra=90)  # ~100 tokens, budget 16 per step
    engine.add(GenerationRequest("long", long_prompt, SamplingParams(max_tokens=2, seed=5)))
    steps_until_long_samples = 0
    while True:
        deltas = {d.request_id: d for d in engine.step()}
        steps_until_long_samples += 1
        assert "talker" in deltas  # decoded in every step of the long prefill
        if "long" in deltas:
            break
        assert engine.stats().prefilling == 1
    assert steps_until_long_samples == -(-len(long_prompt) // 16)
    engine.cancel("talker")
    engine.cancel("long")
    while engine.has_work():
        engine.step()


def test_cancel_frees_the_slot_at_the_next_step(engine):
    params = SamplingParams(max_tokens=50, seed=6)
    for i in range(4):
        engine.add(GenerationRequest(f"c{i}", speech_prompt(i), params))
    engine.step()
    assert engine.stats().active == 4
    engine.cancel("c1")
    engine.cancel("no-such-request")  # ignored
    assert not engine.add(GenerationRequest("next", speech_prompt(9), params))  # c1 holds its slot until the step
    deltas = {d.request_id: d for d in engine.step()}
    assert deltas["c1"].finish_reason == "cancelled" and deltas["c1"].token_ids == []
    assert engine.stats().active == 3
    assert engine.add(GenerationRequest("next", speech_prompt(9), params))
    assert "next" in {d.request_id for d in engine.step()}  # prefilled in the freed slot at once
    for rid in ("c0", "c2", "c3", "next"):
        engine.cancel(rid)
    engine.step()
    assert not engine.has_work() and engine.stats().active == 0


@pytest.mark.parametrize(
    "prompt, params, message",
    [
        ([], SamplingParams(), "empty"),
        ([1, 2, 156940], SamplingParams(), "outside the model's vocabulary"),
        ([-1], SamplingParams(), "outside the model's vocabulary"),
        (list(range(200)), SamplingParams(), "200 tokens; a slot holds 128"),
        ([1, 2], SamplingParams(temperature=-1), "'temperature' = -1 is out of range: must be >= 0.0"),
        ([1, 2], SamplingParams(seed=1.5), "'seed' must be an integer"),  # killed the engine thread once
        ([1, 2], SamplingParams(top_k=1.5), "'top_k' must be an integer"),
        ([1, 2], SamplingParams(top_p=0), "top_p"),
        ([1, 2], SamplingParams(max_tokens=0), "max_tokens"),
    ],
)
def test_bad_requests_are_refused_and_leave_no_trace(engine, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        engine.add(GenerationRequest("bad", prompt, params))
    assert not engine.has_work() and engine.stats().waiting == 0


def test_duplicate_request_ids_are_refused(engine):
    engine.add(GenerationRequest("dup", speech_prompt(0), SamplingParams(max_tokens=1)))
    with pytest.raises(ValueError, match="already in the engine"):
        engine.add(GenerationRequest("dup", speech_prompt(1)))
    drive(engine, {})


def test_stop_ids_and_a_full_slot_finish_requests(engine, eos_happy_dir):
    # A full slot: a 120-token prompt in a 128-token slot leaves KV room for 8 generated tokens, and
    # the 9th is sampled from the last position (it needs no KV entry).
    out = drive(engine, {0: [GenerationRequest("full", list(range(1000, 1119)) + [orpheus.START_OF_SPEECH],
                                               SamplingParams(max_tokens=100, seed=1))]})
    assert out["full"][-1].finish_reason == "length" and len(tokens_of(out["full"])) == 9
    # A stop id: the greedy first token, declared a stop id, ends the request at once.
    greedy = SamplingParams(temperature=0, max_tokens=10, constrain_audio=False, stop_ids=())
    first = tokens_of(drive(engine, {0: [GenerationRequest("probe", [5, 6, 7], greedy)]})["probe"])[0]
    out = drive(engine, {0: [GenerationRequest("stop", [5, 6, 7], SamplingParams(**{**greedy.__dict__, "stop_ids": (first,)}))]})
    assert tokens_of(out["stop"]) == [first] and out["stop"][-1].finish_reason == "stop"


@pytest.mark.parametrize("on_device", [False, True])
def test_end_of_speech_only_at_frame_boundaries(eos_happy_dir, on_device):
    eng = make_engine(eos_happy_dir, slots=4, max_batch_size=4, static_decode=on_device)
    arrivals = {0: [GenerationRequest(f"e{i}", AUDIO_PROMPT, SamplingParams(max_tokens=200, seed=i, temperature=1.0,
                                                                            top_p=1.0)) for i in range(4)]}
    out = drive(eng, arrivals)
    lengths = []
    for i in range(4):
        tokens = tokens_of(out[f"e{i}"])
        assert out[f"e{i}"][-1].finish_reason == "stop" and tokens[-1] == orpheus.END_OF_SPEECH
        assert (len(tokens) - 1) % 7 == 0  # whole frames, then end-of-speech
        lengths.append(len(tokens))
    assert len(set(lengths)) > 1  # the stop came at different frames, not at a fixed length


@pytest.mark.parametrize("on_device", [False, True])
def test_min_tokens_holds_back_the_stop(eos_happy_dir, on_device):
    eng = make_engine(eos_happy_dir, slots=4, max_batch_size=4, static_decode=on_device)
    params = SamplingParams(max_tokens=200, min_tokens=50, seed=3, temperature=1.0, top_p=1.0)
    out = drive(eng, {0: [GenerationRequest(f"m{i}", AUDIO_PROMPT, params) for i in range(4)]})
    for i in range(4):  # this model says end-of-speech at the first frame boundary it may
        tokens = tokens_of(out[f"m{i}"])
        assert tokens[-1] == orpheus.END_OF_SPEECH and len(tokens) - 1 >= 50 and (len(tokens) - 1) % 7 == 0
    free = drive(eng, {0: [GenerationRequest("free", AUDIO_PROMPT, SamplingParams(max_tokens=200, seed=3))]})
    assert len(tokens_of(free["free"])) < 50


@pytest.mark.parametrize("stage, on_device", [("prefill", False), ("decode", False), ("sampling", False),
                                               ("prefill", True), ("decode", True)])
def test_a_failing_step_fails_only_the_request_that_causes_it(demo_dir, stage, on_device, monkeypatch):
    """A batched step that raises runs again request by request: only the poisoned request ends, with
    an error; the others in that step (seeded) get exactly the tokens they get without the fault. The
    same with the audio rows' on-device step (a CPU runs it eagerly)."""
    def generate(fault: bool):
        eng = make_engine(demo_dir / "llama", slots=4, max_batch_size=4, static_decode=on_device)
        if fault:
            poison(monkeypatch, eng, stage, "bad", after=3)
        requests = [GenerationRequest(rid, speech_prompt(i), SamplingParams(max_tokens=20, seed=i))
                    for i, rid in enumerate(("a", "bad", "b"))]
        return eng, drive(eng, {0: requests})  # one prefill forward, then every decode step, for all three

    _, clean = generate(fault=False)
    eng, out = generate(fault=True)
    bad = out["bad"][-1]
    assert bad.finish_reason == "error" and f"RuntimeError: simulated {stage} fault" in bad.error
    assert len(tokens_of(out["bad"])) == (0 if stage == "prefill" else 3)
    assert [tokens_of(out[r]) for r in "ab"] == [tokens_of(clean[r]) for r in "ab"]
    assert [out[r][-1].finish_reason for r in "ab"] == ["length", "length"] and len(tokens_of(clean["a"])) == 20
    assert eng.stats().active == 0  # the poisoned request's slot came back too
    later = drive(eng, {0: [GenerationRequest("c", AUDIO_PROMPT, SamplingParams(max_tokens=5, seed=3))]})
    assert later["c"][-1].finish_reason == "length" and len(tokens_of(later["c"])) == 5


def test_a_seeded_request_draws_the_same_tokens_alone_and_in_a_full_batch(demo_dir):
    params = SamplingParams(max_tokens=40, seed=1234)  # default sampling: temperature, top-p, penalty
    alone = make_engine(demo_dir / "llama", slots=8, max_batch_size=8)
    solo = tokens_of(drive(alone, {0: [GenerationRequest("x", AUDIO_PROMPT, params)]})["x"])
    crowd = make_engine(demo_dir / "llama", slots=8, max_batch_size=8)
    others = {s: [GenerationRequest(f"o{s}", speech_prompt(s, extra=s), SamplingParams(max_tokens=60, seed=s,
                                                                                         temperature=0.9))]
              for s in range(0, 7)}
    others.setdefault(3, []).append(GenerationRequest("x", AUDIO_PROMPT, params))  # joins a busy batch
    batched = tokens_of(drive(crowd, others)["x"])
    assert batched == solo and len(solo) == 40
    other = tokens_of(drive(alone, {0: [GenerationRequest("y", AUDIO_PROMPT, SamplingParams(max_tokens=40, seed=99))]})["y"])
    assert other != solo


@pytest.fixture(scope="module")
def on_device_engine(demo_dir):
    return make_engine(demo_dir / "llama", slots=4, max_batch_size=4, max_prefill_tokens=16, max_seq_len=128,
                       static_decode=True)


@pytest.mark.parametrize("which", ["host", "on-device"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**31),
    temperature=st.one_of(st.just(0.0), st.floats(0.01, 3.0)),  # (0 < t < 0.01 is refused: MIN_TEMPERATURE)
    top_p=st.floats(0.01, 1.0),
    top_k=st.sampled_from([0, 1, 5, 50, 5000]),
    penalty=st.floats(1.0, 2.0),
    window=st.integers(0, 20),
    stagger=st.integers(0, 6),
)
def test_constrained_sampling_never_emits_an_invalid_audio_id(
    engine, on_device_engine, which, seed, temperature, top_p, top_k, penalty, window, stagger
):
    engine = on_device_engine if which == "on-device" else engine
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, repetition_penalty=penalty,
                            repetition_window=window, max_tokens=30, seed=seed)
    arrivals = {0: [GenerationRequest("a", AUDIO_PROMPT, params)]}
    arrivals.setdefault(stagger, []).append(GenerationRequest("b", speech_prompt(seed % 50), params))
    out = drive(engine, arrivals)
    for rid in ("a", "b"):
        tokens = tokens_of(out[rid])
        parser = orpheus.AudioTokenParser()
        frames = parser.feed(tokens)
        st_ = parser.stats
        assert st_.invalid_tokens == 0 and st_.non_audio_tokens == 0 and st_.after_stop == 0
        if parser.finished:
            assert parser.pending_tokens == 0
        assert len(frames) == st_.audio_tokens // 7


def test_prompt_without_start_of_speech_samples_freely_until_it_comes(demo_dir):
    # Without start-of-speech at the end of the prompt the whole vocabulary is open; the recorded
    # logits cover it.
    eng = make_engine(demo_dir / "llama", slots=2, max_batch_size=2)
    out = drive(eng, {0: [GenerationRequest("t", [orpheus.BOS, 400, 401], SamplingParams(max_tokens=3, seed=0),
                                            record_logits=True)]})
    assert all(d.logits.shape[-1] == orpheus.VOCAB_SIZE for d in out["t"])
    assert torch.equal(out["t"][0].logits_ids[0], torch.arange(orpheus.VOCAB_SIZE))
