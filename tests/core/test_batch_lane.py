"""The batch lane in the scheduler (lyre.core.lanes), with a scripted clock and token source: batch
sessions take only slots live work leaves free, give one back within a step when a live session
waits, sit out while a live session waits for its first audio, never pass the admission gate and
have no listener to be late for."""

from __future__ import annotations

from lyre.core.lanes import EVICTED
from lyre.core.session import CANCELLED, FINISHED, ChunkEvent, Segment, Session
from lyre.engine.base import SamplingParams
from tests.core.test_scheduler import done, make, open_session, run


def open_batch(sch, clock, name, reads=True):
    """A batch session, handed to the scheduler as the batch runner does (no admission gate)."""
    events: list = []

    def sink(ev):
        events.append(ev)
        if reads and isinstance(ev, ChunkEvent):
            s.consumed_samples += len(ev.pcm)

    s = Session(name, [Segment([1, 2, 3])], SamplingParams(), sink, clock(), batch=True)
    sch.submit(s)
    return s, events


def test_batch_sessions_fill_free_slots_but_leave_the_reserved_ones():
    sch, engine, clock, gate = make(capacity=6, batch=6, tokens=400, reserved_slots=2)
    batch = [open_batch(sch, clock, f"b{i}")[0] for i in range(6)]
    run(sch, clock, 3)
    assert engine.stats().active == 4  # 6 slots, 2 kept for live arrivals
    assert sum(s.status == "active" for s in batch) == 4
    sch.publish()
    assert gate.inside == 0 and not gate.full  # the backlog is not in the admission gate (/ready unaffected)
    assert sch.snapshot.scheduler.batch_sessions == 4 and sch.snapshot.scheduler.batch_waiting == 2
    assert sch.snapshot.scheduler.active_sessions == 0  # the live figures (and utilisation) leave the lane out
    assert sch.utilisation == 0


def test_a_live_session_gets_a_slot_from_the_batch_lane_within_a_step():
    sch, engine, clock, gate = make(capacity=4, batch=4, tokens=400, reserved_slots=0)
    batch = {name: open_batch(sch, clock, name) for name in ("b0", "b1", "b2", "b3")}
    run(sch, clock, 5)
    assert engine.stats().active == 4
    batch["b3"][0].tokens = 0  # the one that would lose the least work
    live, live_events = open_session(sch, gate, clock, "live")
    sch.step()  # the live session waits: a batch session is evicted, its slot free at the next engine step
    assert done(batch["b3"][1]).outcome == CANCELLED and done(batch["b3"][1]).reason == EVICTED
    assert sum(done(ev) is None for _, ev in batch.values()) == 3  # only as many as needed
    assert sch.batch.evictions == 1
    sch.step()
    assert live.status == "active" and any(q.request.request_id == "live#0" for q in engine._active)
    run(sch, clock, 900)  # (the batch sessions decode once the live one holds batch_live_slack_s of audio)
    assert done(live_events).outcome == FINISHED
    assert all(done(ev).outcome == FINISHED for name, (_, ev) in batch.items() if name != "b3")


def test_batch_waits_while_live_sessions_queue_and_resumes_after():
    sch, engine, clock, gate = make(capacity=2, batch=2, tokens=60, reserved_slots=0)
    live = [open_session(sch, gate, clock, f"l{i}") for i in range(3)]
    b, b_events = open_batch(sch, clock, "b")
    run(sch, clock, 2)
    assert b.status == "pending"  # live sessions are waiting: no slot goes to the batch lane
    run(sch, clock, 400)
    assert all(done(ev).outcome == FINISHED for _, ev in live)
    assert done(b_events).outcome == FINISHED


def test_batch_sits_out_while_a_live_session_waits_for_its_first_audio():
    sch, engine, clock, gate = make(capacity=4, batch=4, tokens=400, reserved_slots=1)
    open_batch(sch, clock, "b0")
    open_batch(sch, clock, "b1")
    run(sch, clock, 5)
    assert any("b0#0" in chosen for chosen in engine.chosen_log)
    open_session(sch, gate, clock, "new")
    engine.chosen_log.clear()
    run(sch, clock, 10)  # fewer than ttfb_priority_tokens (20) tokens: it is new for all of these
    assert engine.chosen_log and all(chosen == ["new#0"] for chosen in engine.chosen_log if chosen)


def test_a_batch_session_is_never_timed_out_or_cut_off_as_a_slow_consumer():
    # a writer that reads nothing for longer than every timeout: the session waits for it (backpressure)
    sch, engine, clock, gate = make(capacity=2, batch=2, tokens=2000, reserved_slots=0,
                                    session_timeout_s=1.0, consumer_timeout_s=1.0, max_buffer_s=0.5)
    b, events = open_batch(sch, clock, "b", reads=False)
    run(sch, clock, 600, dt=0.05)  # 30 s of scripted time
    assert done(events) is None and b.status == "active"
    assert b.throttled  # its unread audio holds it back instead
    assert b.clock_at is None and b.played_s == 0  # no listener's clock


def test_cancelling_a_waiting_batch_session_ends_it():
    sch, engine, clock, gate = make(capacity=1, batch=1, tokens=400, reserved_slots=0)
    open_session(sch, gate, clock, "live")
    b, events = open_batch(sch, clock, "b")
    sch.step()
    sch.cancel("b", "cancelled")
    sch.step()
    assert done(events).outcome == CANCELLED and not sch.batch


def test_batch_decodes_only_while_every_live_session_holds_batch_live_slack_s():
    from lyre.core.lanes import BatchLane
    from lyre.core.policy import FairPolicy
    from tests.core.test_scheduler import playing

    cfg = make(batch_live_slack_s=1.0)[0].cfg
    is_new = FairPolicy(cfg).is_new
    lane = BatchLane(cfg.batch_live_slack_s, cfg.max_buffer_s)
    comfortable, dry = playing("comfortable", 1.5), playing("dry", 0.4)
    assert lane.may_decode([comfortable], is_new, 0.0)
    assert not lane.may_decode([comfortable, dry], is_new, 0.0)  # one about to run dry
    new = playing("new", 5.0, tokens=3)
    assert not lane.may_decode([comfortable, new], is_new, 0.0)  # one waits for audio
    assert lane.may_decode([], is_new, 0.0)  # no live work: the lane has the engine
    fast = playing("fast", 0.0)  # played at 4x (a response's speed): max_buffer_s (2 s) lasts it 0.5 s
    fast.audio_samples, fast.tempo = int((10.0 + 0.3 * 4) * 24000), 4.0  # (0.3 s of listening held)
    assert fast.slack(0.0) < cfg.batch_live_slack_s and lane.may_decode([comfortable, fast], is_new, 0.0)


def test_the_lane_runs_beside_live_sessions_whose_buffer_is_smaller_than_batch_live_slack_s():
    """A live session whose client reads no further ahead than it must stops at max_buffer_s of unread
    audio: with max_buffer_s 0.5 s it never holds batch_live_slack_s (1 s), so the lane asks for half
    the buffer instead of never running."""
    sch, engine, clock, gate = make(capacity=2, batch=2, tokens=10_000, reserved_slots=0, max_buffer_s=0.5,
                                    batch_live_slack_s=1.0)
    live, _ = open_session(sch, gate, clock, "live", reads=False)
    open_batch(sch, clock, "b")
    run(sch, clock, 100, dt=0.002)  # 0.2 s of scripted time: it fills its buffer, then waits for its reader
    assert live.throttled
    assert any("b#0" in chosen for chosen in engine.chosen_log)


def test_a_live_session_waiting_for_its_own_accounts_quota_does_not_hold_the_lane_back():
    from lyre.config import load_config
    from lyre.core.admission import AdmissionGate
    from lyre.core.scheduler import Scheduler
    from lyre.trust.quotas import Limits
    from tests.support.fakes import FakeClock, FakeTokenEngine, silent_pipeline

    cfg = load_config(None, {"scheduler.max_concurrent_sessions": 4, "scheduler.max_batch_size": 4,
                             "scheduler.reserved_slots": 0}).scheduler
    one_slot = Limits(max_sessions=1, max_queued=10, max_ws_contexts=1, max_enrollments=1, max_verifies=1,
                      chars_per_minute=0, weight=1.0)
    gate = AdmissionGate(4, 10, lambda account: one_slot)
    clock = FakeClock()
    sch = Scheduler(cfg, FakeTokenEngine(capacity=4, max_batch_size=4, tokens_per_request=400), silent_pipeline(),
                    gate, clock=clock)
    first, _ = open_session(sch, gate, clock, "first")
    second, _ = open_session(sch, gate, clock, "second")  # waits for its account's one slot, not for a free one
    b, _ = open_batch(sch, clock, "b")
    run(sch, clock, 30)  # (past the first session's first-audio priority)
    assert first.status == "active" and second.status == "pending"
    assert b.status == "active"  # the lane takes a slot nobody else can use now
