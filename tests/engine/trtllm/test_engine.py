"""The TensorRT-LLM backend's translation into Executor calls and its dispatch of streamed responses,
against ``tests/support/fake_trtllm.py`` (a FAKE of ``tensorrt_llm.bindings.executor``: no GPU here)."""

from __future__ import annotations

import queue
import threading
import time

import pytest
import torch

from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.trtllm.config import TrtllmEngineConfig
from lyre.engine.trtllm.engine import TrtllmEngine
from lyre.engine.trtllm.logits import LogitsPostProcessor
from lyre.engine.trtllm.requests import executor_priority
from lyre.model import orpheus
from tests.support import fake_trtllm as tle
from tests.support.trtllm import PROMPT, make, req, run, tokens


@pytest.fixture
def engine(tmp_path):
    e = make(tmp_path, max_batch_size=4, max_seq_len=128, max_input_len=64)
    yield e
    e.close()








# --------------------------------------------------------------------------------------------
# requests -> Executor calls


def test_executor_is_configured_for_no_eviction_chunked_context_and_the_audio_constraint(tmp_path):
    cfg = TrtllmEngineConfig(str(tmp_path), max_batch_size=24, max_num_tokens=4096, free_gpu_memory_fraction=0.7,
                             enable_block_reuse=False, kv_max_tokens=24 * 4096)
    e = TrtllmEngine(cfg, bindings=tle)
    try:
        ec = e.executor.config
        assert ec.scheduler_config.capacity_scheduler_policy == tle.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
        assert ec.enable_chunked_context and ec.max_beam_width == 1
        assert (ec.max_batch_size, ec.max_num_tokens) == (24, 4096)
        assert ec.kv_cache_config.free_gpu_memory_fraction == 0.7 and ec.kv_cache_config.enable_block_reuse is False
        assert ec.kv_cache_config.max_tokens == 24 * 4096  # every slot full, no more: the codec keeps its memory
        assert ec.logits_post_processor_config.processor_batched is e.post_processor
        assert e.capacity == 24
    finally:
        e.close()


def test_a_request_streams_token_ids_with_max_tokens_stop_ids_and_sampling_set(engine):
    engine.add(req("a", max_tokens=300, temperature=0.7, top_p=0.9, top_k=50, repetition_penalty=1.2, min_tokens=7,
                   seed=11))
    r = engine.executor.enqueued[-1]
    assert r.input_token_ids == PROMPT and r.streaming is True
    assert r.max_tokens == 128 - len(PROMPT)  # clipped to what the sequence can hold
    assert r.output_config.exclude_input_from_output
    assert r.end_id == orpheus.END_OF_SPEECH and r.pad_id == orpheus.PAD
    assert sorted(w[0] for w in r.stop_words) == sorted(set(orpheus.STOP_IDS) - {orpheus.END_OF_SPEECH})
    sc = r.sampling_config
    assert (sc.temperature, sc.top_p, sc.top_k, sc.repetition_penalty, sc.min_tokens, sc.seed) == (
        0.7, 0.9, 50, None, 7, 11)  # the penalty is Lyre's, in the post-processor (tests/engine/test_logits_spec.py)
    assert engine.post_processor.requests[r.client_id].penalty == 1.2
    assert r.logits_post_processor_name == tle.Request.BATCHED_POST_PROCESSOR_NAME


def test_greedy_off_switches_and_unconstrained_requests_translate(engine):
    engine.add(req("g", temperature=0.0, top_k=0, repetition_penalty=1.0, constrain_audio=False))
    sc = engine.executor.enqueued[-1].sampling_config
    assert (sc.top_k, sc.top_p, sc.temperature, sc.repetition_penalty, sc.min_tokens) == (1, None, None, None, None)
    assert engine.executor.enqueued[-1].logits_post_processor_name is None


def test_unseeded_requests_get_distinct_random_seeds(engine):
    # The executor's default seed is 0 for everyone: identical prompts would speak identically.
    for i in range(4):
        engine.add(req(f"u{i}"))
    seeds = [r.sampling_config.seed for r in engine.executor.enqueued]
    assert len(set(seeds)) == 4 and all(s is not None and s >= 0 for s in seeds)


def test_priorities_map_onto_the_executor_range(engine):
    assert [executor_priority(p) for p in (0, 1, 2, 7)] == [0.5, 0.75, 1.0, 1.0]
    for rid, priority in (("ongoing", 0), ("new", 1), ("continuation", 2)):
        engine.add(req(rid, priority=priority))
    assert [tle.priority_of(r) for r in engine.executor.enqueued] == [0.5, 0.75, 1.0]


def test_add_returns_false_at_the_engine_batch_size_and_enqueues_nothing(tmp_path):
    e = make(tmp_path, max_batch_size=1)
    try:
        assert e.capacity == 1 and e.add(req("running", max_tokens=3)) is True
        assert e.add(req("next", max_tokens=3, priority=1)) is False
        assert len(e.executor.enqueued) == 1 and (e.stats().active, e.stats().total_requests) == (1, 1)
        assert "next" not in run(e)
        assert e.add(req("next", max_tokens=3, priority=1)) is True  # the slot came free
        assert len(e.executor.enqueued) == 2 and tokens(run(e)["next"])
    finally:
        e.close()


def test_step_accepts_an_order_and_ignores_it(engine):
    # The executor batches every admitted request itself: requests outside the order still decode.
    engine.add(req("a", max_tokens=7, min_tokens=7))
    engine.add(req("b", max_tokens=7, min_tokens=7))
    out: dict[str, list] = {}
    for _ in range(2000):
        if not engine.has_work():
            break
        for d in engine.step(order=["b", "no-such-request"]):
            out.setdefault(d.request_id, []).append(d)
    assert not engine.has_work() and len(tokens(out["a"])) == 7 and len(tokens(out["b"])) == 7


def test_bad_requests_are_refused_before_reaching_the_executor(engine):
    for bad, message in [
        (GenerationRequest("e", []), "empty"),
        (GenerationRequest("v", [orpheus.VOCAB_SIZE]), "vocabulary"),
        (GenerationRequest("l", [1] * 65), "build.max_input_len"),
        (GenerationRequest("s", [1], SamplingParams(top_p=0)), "top_p"),
    ]:
        with pytest.raises(ValueError, match=message):
            engine.add(bad)
    engine.add(req("dup"))
    with pytest.raises(ValueError, match="already"):
        engine.add(req("dup"))
    assert len(engine.executor.enqueued) == 1


# --------------------------------------------------------------------------------------------
# streamed responses -> deltas


def test_responses_become_one_delta_per_request_per_step_ending_with_the_reason(engine):
    engine.add(req("a", max_tokens=10, min_tokens=10, seed=1))
    engine.add(req("b", max_tokens=21, min_tokens=21, seed=2))
    out = run(engine)
    for rid, n in (("a", 10), ("b", 21)):
        assert len(tokens(out[rid])) == n
        assert all(not d.finished for d in out[rid][:-1]) and out[rid][-1].finish_reason == "length"
        assert all(len({d.request_id for d in ds}) == 1 for ds in [out[rid]])
    assert engine.stats().total_tokens == 31 and not engine.has_work()


def test_stop_words_and_end_id_finish_as_stop(tmp_path):
    e = make(tmp_path)
    try:
        # Unconstrained, greedy fake-model output; make its first pick a stop word and then the end id.
        e.add(req("first", max_tokens=50, seed=5, constrain_audio=False, temperature=0.0))
        first = tokens(run(e)["first"])[0]
        e.add(GenerationRequest("sw", list(PROMPT), SamplingParams(max_tokens=50, seed=5, constrain_audio=False,
                                                                   temperature=0.0, stop_ids=(999999, first))))
        out = run(e)["sw"]
        assert out[-1].finish_reason == "stop" and tokens(out) == [first]  # a stop word is kept, as TRT does
        e.add(GenerationRequest("end", list(PROMPT), SamplingParams(max_tokens=50, seed=5, constrain_audio=False,
                                                                    temperature=0.0, stop_ids=(first,))))
        out = run(e)["end"]
        assert out[-1].finish_reason == "stop" and tokens(out) == []  # the end id is not returned
    finally:
        e.close()


def test_cancel_calls_cancel_request_and_frees_the_request_at_the_next_step(engine):
    engine.add(req("keep", max_tokens=40, min_tokens=40))
    engine.add(req("drop", max_tokens=40, min_tokens=40))
    engine.step()
    engine.step()
    engine.cancel("drop")
    engine.cancel("drop")  # twice is harmless
    engine.cancel("never-added")
    assert engine.executor.cancelled == [2]  # the executor's id of "drop" (ids count from 1)
    deltas = {d.request_id: d for d in engine.step()}
    assert deltas["drop"].finished and deltas["drop"].finish_reason == "cancelled"
    out = run(engine)
    assert "drop" not in out  # whatever the executor still sent for it was dropped
    assert out["keep"][-1].finish_reason == "length" and engine.stats().active == 0


def test_an_error_response_fails_only_its_request(engine):
    engine.add(req("bad", max_tokens=40))
    engine.add(req("good", max_tokens=14, min_tokens=14))
    engine.executor.error_request(1, "[TensorRT-LLM][ERROR] simulated request failure")
    out = run(engine)
    assert out["bad"][-1].finish_reason == "error" and "simulated request failure" in out["bad"][-1].error
    assert out["good"][-1].finish_reason == "length" and len(tokens(out["good"])) == 14


def test_an_executor_failure_fails_everything_in_flight_and_refuses_new_work(tmp_path):
    e = make(tmp_path)
    try:
        e.executor.fail_next_await = RuntimeError("CUDA error: an illegal memory access")
        e.add(req("x", max_tokens=30))
        out = run(e)
        assert out["x"][-1].finish_reason == "error" and "illegal memory access" in out["x"][-1].error
        with pytest.raises(ValueError, match="executor failed"):
            e.add(req("y"))
    finally:
        e.close()


def test_iteration_statistics_reach_stats(engine):
    """Including iterations whose optional KV cache statistics are absent (every third, in the
    fake): the last known figures stay."""
    engine.add(req("a", max_tokens=14, min_tokens=14))
    kv_max = []
    while engine.has_work():
        engine.step()
        kv_max.append(engine.stats().extra.get("kv_blocks_max"))
    assert kv_max[2:] == [1000] * len(kv_max[2:])  # from the first statistics that had them on
    s = engine.stats()
    assert s.backend == "trtllm" and s.capacity == 4 and s.total_steps >= 14
    assert s.extra["iter_latency_ms"] == 1.0 and s.extra["kv_blocks_max"] == 1000
    assert (s.active, s.waiting) == (0, 0)


def test_close_stops_the_pump_and_shuts_the_executor_down(tmp_path):
    e = TrtllmEngine(TrtllmEngineConfig(str(tmp_path)), bindings=tle)
    pump = e._pump
    e.close()
    assert not pump.is_alive() and not e.executor.can_enqueue_requests()
    assert "lyre-trtllm-pump" not in [t.name for t in threading.enumerate()]


# --------------------------------------------------------------------------------------------
# constrained audio sampling (the batched logits post-processor)


def test_constrained_requests_emit_only_valid_codes_for_each_frame_slot(engine):
    engine.add(req("c", max_tokens=70, min_tokens=70, seed=3))
    engine.add(req("free", max_tokens=70, min_tokens=70, seed=3, constrain_audio=False))
    out = run(engine)
    c = tokens(out["c"])
    assert len(c) == 70
    assert all(orpheus.AUDIO_TOKEN_OFFSET + (k % 7) * 4096 <= t < orpheus.AUDIO_TOKEN_OFFSET + (k % 7 + 1) * 4096
               for k, t in enumerate(c))
    assert sum(orpheus.AUDIO_TOKEN_OFFSET <= t < orpheus.AUDIO_ID_END for t in tokens(out["free"])) < 35
    assert engine.executor.post_processor_calls > 0 and engine.post_processor.requests == {}


def test_the_first_token_is_constrained_even_when_the_executor_samples_it_before_enqueue_returns(engine):
    """The executor's thread may run a new request's first iteration before ``enqueue_request`` has
    returned its id (the fake's eager mode does exactly that, from another thread): the constraint
    knows the request by its client id, registered before enqueueing, so the first token is
    already a code of frame slot 0."""
    engine.executor.eager = True
    for i in range(4):  # the engine's capacity
        assert engine.add(req(f"e{i}", max_tokens=8, min_tokens=8, seed=20 + i))
        assert engine.executor.enqueued[-1].client_id is not None
        assert engine.executor.post_processor_calls == i + 1  # its first iteration ran before add returned
    out = run(engine)
    for i in range(4):
        first, *rest = tokens(out[f"e{i}"])
        assert orpheus.AUDIO_TOKEN_OFFSET <= first < orpheus.AUDIO_TOKEN_OFFSET + 4096  # frame slot 0
        assert len(rest) == 7
    assert engine.post_processor.requests == {}


def test_a_constraint_that_fails_for_one_request_ends_only_that_request(engine, monkeypatch):
    """An exception out of the post-processor would make the executor fail every active request
    (the fake does as the real one): the constraint keeps it in, and only its request ends."""
    import lyre.engine.trtllm.logits as module

    process = module.process_row
    faults = [RuntimeError("simulated constraint fault")]

    def failing(row, *args):
        if row.audio_index == 9 and faults:  # the first request to reach its 10th audio token, once
            raise faults.pop()
        process(row, *args)

    monkeypatch.setattr(module, "process_row", failing)
    for i in range(4):
        engine.add(req(f"c{i}", max_tokens=21, min_tokens=21, seed=40 + i))
    out = run(engine)
    failed = [r for r in out if out[r][-1].finish_reason == "error"]
    assert len(failed) == 1
    for r in failed:
        assert "the logits post-processing failed: RuntimeError: simulated constraint fault" in out[r][-1].error
        assert len(tokens(out[r])) == 9  # nothing sampled without the constraint reached the caller
    for r in set(out) - set(failed):
        c = tokens(out[r])
        assert len(c) == 21 and all(orpheus.AUDIO_TOKEN_OFFSET + (k % 7) * 4096 <= t < orpheus.AUDIO_TOKEN_OFFSET
                                    + (k % 7 + 1) * 4096 for k, t in enumerate(c))
    assert engine.post_processor.requests == {} and engine.post_processor.failed == {} and not engine.has_work()


class HeldInbox(queue.Queue):
    """The engine's inbox with the pump's deliveries held back until released: the executor can run
    ahead of the responses the engine thread has seen, as the real one does under load."""

    def __init__(self, expect: int) -> None:
        super().__init__()
        self.holding = True
        self.held: list = []
        self.arrived = threading.Event()  # set once ``expect`` responses are held
        self.expect = expect

    def put(self, item, block=True, timeout=None) -> None:
        if not self.holding:
            return super().put(item, block, timeout)
        self.held.append(item)
        if len(self.held) >= self.expect:
            self.arrived.set()

    def release(self, n: int | None = None) -> None:
        """Hand over the first ``n`` held responses (all, and stop holding, when ``n`` is None)."""
        if n is None:
            self.holding, n = False, len(self.held)
        for item in self.held[:n]:
            super().put(item)
        del self.held[:n]


def test_tokens_sampled_before_a_constraint_failure_are_delivered_even_when_they_arrive_after_it(engine,
                                                                                             monkeypatch):
    """The executor thread can record a failure before the pump hands over the responses of the
    iterations before it: the engine still delivers every token sampled under the constraint (and
    no more), then ends the request."""
    import lyre.engine.trtllm.logits as module

    process = module.process_row

    def failing(row, *args):
        if row.audio_index == 6:
            raise RuntimeError("simulated constraint fault")
        process(row, *args)

    monkeypatch.setattr(module, "process_row", failing)
    inbox = HeldInbox(expect=7)
    monkeypatch.setattr(engine, "_inbox", inbox)
    engine.add(req("a", max_tokens=21, min_tokens=21, seed=7))
    for _ in range(7):  # tokens 0-5 under the constraint, then token 6 sampled after it failed
        engine.executor.tick()
    assert inbox.arrived.wait(10)
    assert engine.post_processor.failed
    inbox.release(5)  # the engine has seen 5 tokens when it learns of the failure; 2 are on their way
    first = engine.step()
    assert len(tokens(first)) == 5
    assert not any(d.finished for d in first)  # not ended while a good token is still on its way
    inbox.release()
    rest = run(engine).get("a", [])
    got = tokens(first) + tokens(rest)
    assert rest[-1].finish_reason == "error" and "simulated constraint fault" in rest[-1].error
    assert len(got) == 6
    assert all(orpheus.AUDIO_TOKEN_OFFSET + (k % 7) * 4096 <= t < orpheus.AUDIO_TOKEN_OFFSET + (k % 7 + 1) * 4096
               for k, t in enumerate(got))
    assert engine.post_processor.requests == {} and engine.post_processor.failed == {} and not engine.has_work()


def test_a_failure_recorded_after_the_steps_check_still_holds_back_the_unconstrained_token(engine, monkeypatch):
    """The executor can fail the constraint, sample without it and queue that token between the
    step's look at the failures and its reading of the responses: the response is checked too."""
    import lyre.engine.trtllm.logits as module

    process = module.process_row

    def failing(row, *args):
        if row.audio_index == 6:
            raise RuntimeError("simulated constraint fault")
        process(row, *args)

    monkeypatch.setattr(module, "process_row", failing)
    step = lambda: TrtllmEngine.step(engine)  # noqa: E731 - without lockstep's own tick
    first = HeldInbox(expect=6)
    monkeypatch.setattr(engine, "_inbox", first)
    engine.add(req("a", max_tokens=21, min_tokens=21, seed=7))
    for _ in range(6):
        engine.executor.tick()
    assert first.arrived.wait(10)
    first.release()
    got = tokens(step())
    assert len(got) == 6 and not engine.post_processor.failed

    late = HeldInbox(expect=1)
    monkeypatch.setattr(engine, "_inbox", late)
    take = engine._take_constraint_failures

    def take_then_fail():
        take()  # nothing has failed yet ...
        engine.executor.tick()  # ... now the executor fails the constraint and samples token 6 without it
        assert late.arrived.wait(10)
        late.release()

    monkeypatch.setattr(engine, "_take_constraint_failures", take_then_fail)
    deltas = step()
    monkeypatch.setattr(engine, "_take_constraint_failures", take)
    got += tokens(deltas)
    assert len(got) == 6 and deltas[-1].finished and deltas[-1].finish_reason == "error"
    assert "simulated constraint fault" in deltas[-1].error
    assert engine.post_processor.requests == {} and engine.post_processor.failed == {} and not engine.has_work()


def test_a_request_the_executor_refuses_leaves_no_constraint_behind(engine, monkeypatch):
    def refuse(request):
        raise RuntimeError("[TensorRT-LLM][ERROR] cannot enqueue")

    monkeypatch.setattr(engine.executor, "enqueue_request", refuse)
    with pytest.raises(RuntimeError, match="cannot enqueue"):
        engine.add(req("x"))
    assert engine.post_processor.requests == {} and not engine.has_work()


def test_the_mask_rows_keep_the_slot_band_and_end_of_speech_only_at_a_boundary():
    processor = LogitsPostProcessor()
    processor.register(5, PROMPT, SamplingParams(min_tokens=7, repetition_penalty=1.0))
    for k, stop_kept in ((0, False), (3, False), (7, True), (14, True)):  # end-of-speech from min_tokens (7) on
        logits = torch.randn(1, 1, orpheus.VOCAB_SIZE)
        before = logits.clone()
        history = PROMPT + [orpheus.AUDIO_TOKEN_OFFSET + (i % 7) * 4096 for i in range(k)]
        processor([1], [logits], [[history]], 0, [5])
        lo = orpheus.AUDIO_TOKEN_OFFSET + (k % 7) * 4096
        finite = torch.isfinite(logits[0, 0]).nonzero().flatten().tolist()
        expected = list(range(lo, lo + 4096)) + ([orpheus.END_OF_SPEECH] if stop_kept else [])
        assert sorted(finite) == sorted(expected)
        assert torch.equal(logits[0, 0, lo:lo + 4096], before[0, 0, lo:lo + 4096])


def test_the_constraint_waits_for_start_of_speech_when_the_prompt_lacks_it():
    c = LogitsPostProcessor()
    c.register(9, [1, 2, 3], SamplingParams(repetition_penalty=1.0))
    logits = torch.zeros(1, 1, orpheus.VOCAB_SIZE)
    c([40], [logits], [[[1, 2, 3, 50]]], 0, [9])  # (executor ids, logits, beam tokens, stream, client ids)
    assert torch.isfinite(logits).all()  # free before start-of-speech
    c([40], [logits], [[[1, 2, 3, 50, orpheus.START_OF_SPEECH, orpheus.AUDIO_TOKEN_OFFSET + 5]]], 0, [9])
    finite = torch.isfinite(logits[0, 0]).nonzero().flatten()
    assert finite.min() == orpheus.AUDIO_TOKEN_OFFSET + 4096 and len(finite) == 4096  # audio index 1 -> slot 1


# --------------------------------------------------------------------------------------------
# the scheduler over this backend


def test_the_scheduler_streams_sessions_through_the_trtllm_backend_and_closes_it(tmp_path):
    from lyre.config import load_config
    from lyre.core.admission import AdmissionGate
    from lyre.core.scheduler import Scheduler
    from lyre.core.session import ChunkEvent, DoneEvent, Segment, Session
    from tests.support.fakes import silent_pipeline

    cfg = load_config(None, {"scheduler.max_concurrent_sessions": 2, "scheduler.max_batch_size": 2,
                             "scheduler.reserved_slots": 0})
    e = make(tmp_path, max_batch_size=2, max_seq_len=128)
    gate = AdmissionGate(2, 8)
    sch = Scheduler(cfg.scheduler, e, silent_pipeline(), gate)
    events: dict[str, list] = {}
    for name in ("a", "b", "c"):
        gate.enter()
        events[name] = []
        sch.submit(Session(name, [Segment(list(PROMPT)), Segment(list(PROMPT))],
                           SamplingParams(max_tokens=21, min_tokens=21, seed=1), events[name].append, time.monotonic()))
    for _ in range(5000):
        if not sch.has_work():
            break
        sch.step()
    for name, evs in events.items():
        assert isinstance(evs[-1], DoneEvent) and evs[-1].outcome == "finished", name
        assert sum(len(ev.pcm) for ev in evs if isinstance(ev, ChunkEvent)) == 2 * 3 * 2048  # 2 x 3 frames
    assert max(tle.priority_of(r) for r in e.executor.enqueued) == 1.0  # continuations went first
    sch.shutdown()
    assert not e._pump.is_alive() and not e.executor.can_enqueue_requests()


def test_executor_gauges_exist_only_once_the_executor_reports(engine):
    """/metrics on the PyTorch backend has no TensorRT-LLM gauges; the executor's statistics bring them."""
    from lyre.core.metrics import Metrics

    metrics = Metrics()
    metrics.set_engine({})  # the torch backend's extra
    assert b"lyre_engine_iteration_latency_ms" not in metrics.exposition()
    engine.add(req("a", max_tokens=7, min_tokens=7))
    run(engine)
    metrics.set_engine(engine.stats().extra)
    text = metrics.exposition().decode()
    assert "lyre_engine_iteration_latency_ms 1.0" in text and 'lyre_kv_cache_blocks{state="max"} 1000.0' in text
    assert "lyre_engine_queued_requests 0.0" in text
