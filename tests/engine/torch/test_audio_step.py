"""The audio rows' decode step on the device (``lyre.engine.torch.audio_step``): the static-shape step
a GPU captures as CUDA graphs, run here eagerly through the same functions. It must give the host
step's greedy tokens and logits for sessions joining and leaving at any step, keep each row's
sampling its own (seeded draws, the penalty's window), change nothing for the slots it does not
decode, and never fall back to eager in silence when a graph cannot be captured."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from lyre.config import load_config
from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.torch.audio_step import AudioStep
from lyre.engine.torch.cuda_graphs import GraphCaptureError
from lyre.engine.torch.engine import TorchEngineConfig
from lyre.engine.torch.slot_sampling import EOS_BIN, SlotSampling
from lyre.engine.torch.static import length_buckets, slot_buckets
from lyre.model import orpheus
from tests.support.engines import drive, make_engine, tokens_of


def prompt(i: int) -> list[int]:
    return [orpheus.START_OF_HUMAN, orpheus.BOS, *range(300 + 7 * i, 303 + 7 * i + i % 4), *orpheus.PROMPT_SUFFIX]


def staggered(tag: str, greedy: bool, n: int = 8, seed: int = 3) -> dict[int, list[GenerationRequest]]:
    """Sessions arriving over 15 steps with every kind of sampling: penalties with short windows and
    with none, min_tokens, lengths that cross the 64- and 128-position buckets, recorded logits."""
    rng = random.Random(seed)
    arrivals: dict[int, list[GenerationRequest]] = {}
    for i in range(n):
        params = SamplingParams(
            temperature=0.0 if greedy else rng.choice([0.6, 1.0, 1.4]), top_k=rng.choice([0, 0, 40]),
            top_p=rng.choice([0.8, 1.0]), repetition_penalty=rng.choice([1.0, 1.1, 1.5]),
            repetition_window=rng.choice([0, 3, 64]), min_tokens=rng.choice([0, 14]),
            max_tokens=rng.choice([20, 60, 130]), seed=100 + i)
        arrivals.setdefault(rng.randrange(15), []).append(
            GenerationRequest(f"{tag}{i}", prompt(i), params, record_logits=i % 3 == 0))
    return arrivals


def test_greedy_tokens_and_logits_equal_the_host_steps(demo_dir):
    """Sessions join and leave at different steps (slots reused, gap rows, every length bucket up to
    256): the on-device step's greedy tokens are the host step's, and so are the recorded logits."""
    host = drive(make_engine(demo_dir / "llama", slots=6, max_batch_size=6), staggered("s", greedy=True))
    engine = make_engine(demo_dir / "llama", slots=6, max_batch_size=6, static_decode=True)
    device = drive(engine, staggered("s", greedy=True))
    assert engine.on_device.audio.steps > 50 and engine.on_device.audio.gap_rows > 0
    assert device.keys() == host.keys()
    for rid in host:
        assert tokens_of(device[rid]) == tokens_of(host[rid]), rid
        assert device[rid][-1].finish_reason == host[rid][-1].finish_reason
        got = [(d.logits, d.logits_ids) for d in device[rid] if d.logits is not None]
        want = [(d.logits, d.logits_ids) for d in host[rid] if d.logits is not None]
        assert len(got) == len(want)
        for (g, gi), (w, wi) in zip(got, want, strict=True):
            assert torch.equal(gi, wi) and torch.allclose(g, w, atol=1e-4), rid
    assert max(len(tokens_of(d)) for d in device.values()) == 130  # (past 128 positions)


def test_whole_prompts_prefill_on_the_device_beside_chunked_ones(demo_dir):
    """Prompts that fit a step prefill by the static step (packed, padded to a bucket), in the same
    steps as a long prompt's chunks on the host and as decoding rows: the host step's greedy tokens
    and first-token logits."""
    def arrivals() -> dict[int, list[GenerationRequest]]:
        greedy = dict(temperature=0.0, max_tokens=30)
        long = [orpheus.START_OF_HUMAN, *range(300, 340), *orpheus.PROMPT_SUFFIX]  # 45 tokens: 2 chunks of 32
        return {0: [GenerationRequest("short0", prompt(0), SamplingParams(**greedy), record_logits=True),
                    GenerationRequest("long", long, SamplingParams(**greedy), record_logits=True)],
                1: [GenerationRequest(f"short{i}", prompt(i), SamplingParams(**greedy), record_logits=True)
                    for i in (1, 2, 3)]}

    host = drive(make_engine(demo_dir / "llama", slots=6, max_batch_size=6, max_prefill_tokens=32), arrivals())
    engine = make_engine(demo_dir / "llama", slots=6, max_batch_size=6, max_prefill_tokens=32, static_decode=True)
    device = drive(engine, arrivals())
    assert engine.on_device.prefill.steps >= 2 and engine.on_device.prefill.padding > 0
    for rid in host:
        assert tokens_of(device[rid]) == tokens_of(host[rid]), rid
        assert torch.allclose(device[rid][0].logits, host[rid][0].logits, atol=1e-4), rid


def test_a_prompt_that_fits_a_step_waits_for_the_next_one_rather_than_being_split(demo_dir, monkeypatch):
    """Prompts arriving together fill a step's budget whole; one that no longer fits is prefilled whole
    in the next step by the prefill graph, not a piece of it now by the host's forward."""
    engine = make_engine(demo_dir / "llama", slots=4, max_batch_size=4, max_prefill_tokens=32, static_decode=True)
    host_forwards = []
    forward = engine._forward
    monkeypatch.setattr(engine, "_forward", lambda batch: host_forwards.append(batch) or forward(batch))
    prompts = [[orpheus.START_OF_HUMAN, *range(400 + 10 * i, 407 + 10 * i), *orpheus.PROMPT_SUFFIX] for i in range(3)]
    out = drive(engine, {0: [GenerationRequest(f"p{i}", p, SamplingParams(max_tokens=8, seed=i))
                             for i, p in enumerate(prompts)]})
    assert len(prompts[0]) == 12 and all(len(tokens_of(out[f"p{i}"])) == 8 for i in range(3))
    assert host_forwards == [] and engine.on_device.prefill.steps == 2  # (12 + 12 whole, then the third)


def test_a_prefix_that_cannot_be_kept_changes_no_ones_tokens(demo_dir, monkeypatch, caplog):
    """A cloned voice's prefix whose copy fails (the device out of memory) is not kept, and said so; it
    fails nobody: the requests decoding ahead beside it, and it, make the tokens they make without the
    fault (a failure after the launched step's tokens were handed out once made them decode again)."""
    def run(fault: bool) -> dict[str, list[int]]:
        engine = make_engine(demo_dir / "llama", slots=4, max_batch_size=4, static_decode=True,
                             prefix_cache_bytes=1 << 24)
        if fault:
            def put(*args, **kwargs):
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            monkeypatch.setattr(engine.prefixes, "put", put)
        arrivals = {0: [GenerationRequest(r, prompt(i), SamplingParams(max_tokens=30, seed=10 + i))
                        for i, r in enumerate("ab")],
                    5: [GenerationRequest("c", prompt(2), SamplingParams(max_tokens=10, seed=7),
                                          prefix_key="v_x:1", prefix_len=4)]}
        out = drive(engine, arrivals)
        assert all(d.finish_reason == "length" for d in (out[r][-1] for r in "abc"))
        assert engine.kept_prefixes() == ([] if fault else ["v_x:1"])
        return {r: tokens_of(out[r]) for r in "abc"}

    assert run(fault=True) == run(fault=False)
    assert "prefix v_x:1 not kept: OutOfMemoryError" in caplog.text


def test_a_seeded_request_draws_the_same_tokens_alone_and_in_a_busy_batch(demo_dir):
    """Each row draws from its own seed and position: alone, or joining a batch of other sessions in
    another slot, it makes the same tokens; another seed makes others."""
    params = SamplingParams(max_tokens=60, seed=1234)
    alone = make_engine(demo_dir / "llama", slots=8, max_batch_size=8, static_decode=True)
    solo = tokens_of(drive(alone, {0: [GenerationRequest("x", prompt(0), params)]})["x"])
    crowd = make_engine(demo_dir / "llama", slots=8, max_batch_size=8, static_decode=True)
    arrivals = staggered("o", greedy=False, n=6)
    arrivals.setdefault(4, []).append(GenerationRequest("x", prompt(0), params))
    assert tokens_of(drive(crowd, arrivals)["x"]) == solo and len(solo) == 60
    other = drive(alone, {0: [GenerationRequest("y", prompt(0), SamplingParams(max_tokens=60, seed=99))]})
    assert tokens_of(other["y"]) != solo
    assert all(orpheus.is_audio_id(t) for t in solo)


def test_the_penalty_window_on_the_device_holds_the_last_tokens_of_each_row(demo_dir):
    """After every step, a row's device history holds the tokens it was given (then the one computed
    ahead, not yet delivered), and its counts are the bins of the last ``repetition_window`` of those
    (all of them for a window of 0): what the penalty reads for its next token."""
    engine = make_engine(demo_dir / "llama", slots=4, max_batch_size=4, static_decode=True)
    windows = {"w0": 0, "w3": 3, "w9": 9}
    made: dict[str, list[int]] = {}
    for rid, w in windows.items():
        engine.add(GenerationRequest(rid, prompt(len(made)), SamplingParams(
            temperature=1.5, top_p=1.0, repetition_penalty=1.2, repetition_window=w, max_tokens=40, seed=7)))
        made[rid] = []
    sampling = engine.on_device.audio.sampling
    ahead_seen = 0
    while engine.has_work():
        for d in engine.step():
            made[d.request_id] += d.token_ids
        for rid, seq in engine.slots.by_id.items():  # (a finished row's slot is the next request's to reset)
            n = len(made[rid]) + seq.ahead
            ahead_seen += seq.ahead
            history = sampling.history[seq.slot, :n].tolist()
            assert history[: len(made[rid])] == [t - orpheus.AUDIO_TOKEN_OFFSET for t in made[rid]], rid
            w = windows[rid]
            want = Counter(EOS_BIN if b == EOS_BIN else b for b in (history[-w:] if w else history))
            row = sampling.counts[seq.slot]
            got = {int(b): int(row[b]) for b in row.nonzero().flatten()}
            assert got == dict(want), (rid, len(made[rid]))
    assert all(len(t) == 40 for t in made.values()) and ahead_seen > 50


def test_rows_that_do_not_decode_leave_their_slots_as_they_were(demo_dir):
    """A step decoding only some slots of its bucket (others held by sessions the order skips)
    changes nothing of the others: their K/V and their sampling state."""
    engine = make_engine(demo_dir / "llama", slots=4, max_batch_size=4, static_decode=True)
    for i in range(4):
        engine.add(GenerationRequest(f"r{i}", prompt(i), SamplingParams(max_tokens=50, seed=i)))
    for _ in range(5):
        engine.step()
    held = [engine.slots.by_id[r].slot for r in ("r1", "r2")]
    n = engine.cfg.max_seq_len  # (every position a sequence reads; gap rows write the scratch one after them)
    k, v = engine.cache.k[:, held, :, :n].clone(), engine.cache.v[:, held, :, :n].clone()
    sampling = engine.on_device.audio.sampling
    counts, history = sampling.counts[held].clone(), sampling.history[held].clone()
    for _ in range(4):
        assert {d.request_id for d in engine.step(order=["r0", "r3"])} == {"r0", "r3"}
    assert torch.equal(engine.cache.k[:, held, :, :n], k) and torch.equal(engine.cache.v[:, held, :, :n], v)
    assert torch.equal(sampling.counts[held], counts) and torch.equal(sampling.history[held], history)


def test_every_step_launches_the_next_step_of_the_audio_rows_before_it_returns(demo_dir):
    """The device computes each audio row's next token while the caller handles this step's deltas: a
    step returns with every audio row's next token launched (those the order skips too, once), and a
    later step delivers a row's kept token when the order asks for it, relaunching only that row."""
    engine = make_engine(demo_dir / "llama", slots=4, max_batch_size=4, static_decode=True)
    for i in range(3):
        engine.add(GenerationRequest(f"r{i}", prompt(i), SamplingParams(max_tokens=30, seed=i)))
    engine.add(GenerationRequest("free", [orpheus.BOS, 400, 401], SamplingParams(max_tokens=30, seed=9)))
    engine.step()  # the prompts: first tokens, then every audio row's next one launched
    rows = {rid: engine.slots.by_id[rid] for rid in ("r0", "r1", "r2", "free")}
    assert [rows[r].ahead for r in rows] == [True, True, True, False] and engine.on_device.in_flight is not None
    launched = engine.on_device.audio.steps
    got = engine.step(order=["r0", "free"])
    assert {d.request_id for d in got} == {"r0", "free"}
    assert engine.on_device.audio.steps == launched + 1
    assert engine.on_device.in_flight.seqs == [rows["r0"]]  # r1 and r2 keep theirs
    assert rows["r1"].ahead_token is not None and rows["r1"].ahead and rows["r1"].num_generated == 1
    delivered = {d.request_id: d.token_ids for d in engine.step(order=["r1"])}
    assert list(delivered) == ["r1"] and delivered["r1"] == [rows["r1"].next_input]
    assert engine.on_device.in_flight.seqs == [rows["r1"]] and rows["r0"].ahead_token is not None


def test_only_rows_constrained_from_their_first_token_run_on_the_device(demo_dir):
    """A prompt without start-of-speech, or a request without the constraint, samples on the host
    (over the whole vocabulary) beside the device's rows, in the same steps."""
    engine = make_engine(demo_dir / "llama", slots=4, max_batch_size=4, static_decode=True)
    requests = [GenerationRequest("audio", prompt(0), SamplingParams(max_tokens=20, seed=1)),
                GenerationRequest("free", [orpheus.BOS, 400, 401], SamplingParams(max_tokens=20, seed=2)),
                GenerationRequest("open", prompt(1), SamplingParams(max_tokens=20, seed=3, constrain_audio=False))]
    out = drive(engine, {0: requests})
    assert [engine.on_device.audio.steps > 0, all(len(tokens_of(out[r])) == 20 for r in out)] == [True, True]
    assert all(orpheus.is_audio_id(t) for t in tokens_of(out["audio"]))
    assert any(not orpheus.is_audio_id(t) for t in tokens_of(out["free"]) + tokens_of(out["open"]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the capture happens")
def test_a_decode_step_that_cannot_be_captured_stops_the_start_naming_its_bucket(demo_dir):
    """Never a silent fall back to eager (a fraction of the GPU's pace): the first bucket's capture
    fails here (no GPU to capture on) and the error names it and the way out."""
    engine = make_engine(demo_dir / "llama", slots=4, static_decode=True)
    step = AudioStep(engine.model, engine.cache, SlotSampling(4, engine.cfg.max_seq_len, engine.device), graphs=True)
    assert step.slot_buckets == [1, 2, 4] and step.length_buckets == [64, 128, 256]
    assert slot_buckets(256)[-4:] == [160, 192, 224, 256] and length_buckets(4096)[-4:] == [1024, 2048, 3072, 4096]
    with pytest.raises(GraphCaptureError, match=r"the decode step over 1 slots and 64 positions .*"
                                                r"engine\.cuda_graphs: false"):
        step.prepare()


def test_engine_cuda_graphs_reaches_the_engine():
    on = TorchEngineConfig.from_config(load_config(None, ["model.device=cpu"]))
    off = TorchEngineConfig.from_config(load_config(None, ["model.device=cpu", "engine.cuda_graphs=false"]))
    assert (on.cuda_graphs, off.cuda_graphs) == (True, False)
    assert not on.on_device_decode  # (a CPU steps on the host: faster there)
    assert TorchEngineConfig(device="cuda").on_device_decode and TorchEngineConfig(static_decode=True).on_device_decode
