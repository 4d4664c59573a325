"""What a step of the PyTorch engine costs a GPU beyond its arithmetic, counted on CPU: attention
reads the slot KV cache in place whatever order the scheduler gives (no copy of any slot's K/V:
neither a gather of slots nor a repeat of KV heads for grouped-query attention), and a step reads
the device back once (the sampled tokens), never once per row.

On CPU nothing waits, so the test counts the operations that would: every ``aten`` operator is
seen through a ``TorchDispatchMode``, and ``Tensor.tolist`` (which reads without dispatching) is
counted by wrapping it.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.model import orpheus
from tests.support.engines import make_engine, tokens_of

aten = torch.ops.aten
# operators that make the host wait for the device (their result's size or value lives there)
READ_BACKS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default, aten.nonzero.default,
              aten.masked_select.default, aten._unique2.default, aten.unique_consecutive.default,
              aten.unique_dim.default, aten.repeat_interleave.Tensor}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
GATHERS = {aten.index.Tensor, aten.index_select.default, aten.gather.default, aten.take.default,
           aten.repeat_interleave.self_int, aten.repeat_interleave.self_Tensor, aten.repeat.default,
           aten.clone.default, aten.contiguous.default, aten._to_copy.default}


class DeviceTraffic(TorchDispatchMode):
    """Counts read-backs, and gathers (copies) out of the KV cache's storage."""

    def __init__(self, cache):
        super().__init__()
        self.cache_storage = {cache.k.untyped_storage().data_ptr(), cache.v.untyped_storage().data_ptr()}
        self.read_backs: Counter[str] = Counter()
        self.cache_copies = 0
        self.largest_cache_copy = 0  # elements

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in READ_BACKS:
            self.read_backs[str(func)] += 1
        if func in INDEXING and any(i is not None and i.dtype == torch.bool for i in args[1]):
            self.read_backs[f"{func} with a bool mask"] += 1  # a nonzero() inside
        out = func(*args, **(kwargs or {}))
        if func in GATHERS and args[0].untyped_storage().data_ptr() in self.cache_storage:
            self.cache_copies += 1
            self.largest_cache_copy = max(self.largest_cache_copy, out.numel())
        return out


@pytest.fixture
def tolist_calls(monkeypatch) -> list[int]:
    calls = [0]
    tolist = torch.Tensor.tolist

    def counted(self):
        calls[0] += 1
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    return calls


def prompt(i: int, speech: bool = True) -> list[int]:
    text = [orpheus.AUDIO_TOKEN_OFFSET - 1000 + 37 * i + j for j in range(3 + i % 5)]
    suffix = orpheus.PROMPT_SUFFIX if speech else orpheus.PROMPT_SUFFIX[:-1]
    return [orpheus.START_OF_HUMAN, *text, *suffix]


def mixed(i: int, tag: str, record: bool = False) -> GenerationRequest:
    """Every kind of row: seeded sampling, greedy, top-k, top-p 1, min_tokens, no penalty, and rows
    that sample freely (full vocabulary) until start-of-speech comes."""
    kinds = [dict(), dict(temperature=0.0), dict(top_k=40, top_p=0.95), dict(top_p=1.0, repetition_penalty=1.0),
             dict(min_tokens=12, repetition_penalty=1.3)]
    params = SamplingParams(max_tokens=24 + 3 * i, seed=100 + i, **kinds[i % len(kinds)])
    return GenerationRequest(f"{tag}{i}", prompt(i, speech=i % 3 != 2), params, record_logits=record)


def run_shuffled(engine, requests: list[GenerationRequest], shuffle: bool, cancel_at: dict[int, str]):
    """All requests at once, a new random order every step when ``shuffle`` (else admission
    order); ``cancel_at[step]`` is cancelled before that step, leaving a gap among the slots."""
    order = random.Random(7)
    live = []
    for r in requests:
        assert engine.add(r)
        live.append(r.request_id)
    out: dict[str, list] = {}
    step = 0
    while engine.has_work():
        if step in cancel_at:
            engine.cancel(cancel_at[step])
        if shuffle:
            order.shuffle(live)
        for d in engine.step(list(live) if shuffle else None):
            out.setdefault(d.request_id, []).append(d)
            if d.finished:
                live.remove(d.request_id)
        step += 1
    return out


def test_attention_reads_the_kv_cache_in_place_whatever_the_order_of_slots(demo_dir):
    """Shuffled orders and slots freed mid-run (gaps of one and of several slots) copy nothing out
    of the cache, and give the very tokens and logits of admission order."""
    cancel_at = {3: "s1", 5: "s4", 6: "s5", 7: "s6"}  # a 1-slot gap, then a 3-slot one
    requests = lambda tag: [mixed(i, tag, record=True) for i in range(8)]  # noqa: E731
    reference = run_shuffled(make_engine(demo_dir / "llama"), requests("s"), False, cancel_at)
    engine = make_engine(demo_dir / "llama")
    with DeviceTraffic(engine.cache) as traffic:
        shuffled = run_shuffled(engine, requests("s"), True, cancel_at)
    assert traffic.cache_copies == 0
    assert shuffled.keys() == reference.keys()
    for rid in reference:
        assert tokens_of(shuffled[rid]) == tokens_of(reference[rid]), rid
        got = [d.logits for d in shuffled[rid] if d.logits is not None]
        want = [d.logits for d in reference[rid] if d.logits is not None]
        assert len(got) == len(want) and all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want, strict=True))
    assert [reference[r][-1].finish_reason for r in ("s1", "s4")] == ["cancelled", "cancelled"]


@pytest.mark.parametrize("on_device", [False, True])
def test_a_step_reads_the_device_back_once_however_many_rows_it_samples(demo_dir, tolist_calls, on_device):
    """Audio rows on the device or on the host, beside full-vocabulary rows and prompt chunks: one
    read-back a step, and no copy of any slot's K/V (the on-device steps read each row's K/V in place,
    and read only the position a row that does not run writes back)."""
    engine = make_engine(demo_dir / "llama", slots=8, max_batch_size=8, max_prefill_tokens=16,
                         static_decode=on_device)
    per_step: list[tuple[int, int, int]] = []  # (rows sampled, tolist calls, other read-backs)
    step = engine.step
    one_slot = engine.cfg.max_seq_len * engine.model.cfg.num_key_value_heads * engine.model.cfg.head_dim  # (a layer's K)

    def counted_step(order=None):
        before = tolist_calls[0]
        with DeviceTraffic(engine.cache) as traffic:
            deltas = step(order)
        per_step.append((sum(bool(d.token_ids) for d in deltas), tolist_calls[0] - before,
                         sum(traffic.read_backs.values())))
        assert not traffic.read_backs, traffic.read_backs
        assert traffic.largest_cache_copy < one_slot / 4  # (a position of a few rows, never a slot)
        return deltas

    engine.step = counted_step
    out = {}
    waiting = [mixed(i, "r") for i in range(12)]
    while waiting or engine.has_work():
        while waiting and engine.add(waiting[0]):
            waiting.pop(0)
        for d in engine.step():
            out.setdefault(d.request_id, []).append(d)
    assert len(out) == 12 and all(out[r][-1].finish_reason in ("length", "stop") for r in out)
    assert max(rows for rows, _, _ in per_step) == 8  # full batches ...
    assert all(calls == (1 if rows else 0) for rows, calls, _ in per_step)  # ... read back once a step
    assert (engine.on_device is not None and engine.on_device.audio.steps > 10) == on_device
    free = [tokens_of(out[f"r{i}"]) for i in range(12) if i % 3 == 2]
    assert any(not orpheus.is_audio_id(t) for tokens in free for t in tokens)  # full-vocabulary rows ran too


@pytest.mark.parametrize("on_device", [False, True])
def test_attention_never_runs_on_cudnn_whose_plan_is_rebuilt_for_every_new_kv_length(demo_dir, monkeypatch,
                                                                                    on_device):
    """cuDNN's SDPA builds a plan per shape, and a decode step's K/V length is new every step (on an
    H200, 10 ms per call against 0.08 ms for a length seen before): every attention call of a step
    runs with cuDNN's backend off, and the process's setting is left as it was."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    engine = make_engine(demo_dir / "llama", static_decode=on_device)
    for i in range(3):
        engine.add(GenerationRequest(f"r{i}", prompt(i), SamplingParams(max_tokens=9, min_tokens=9, seed=i)))
    while engine.has_work():
        engine.step()
    assert seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
