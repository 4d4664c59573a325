"""Scheduling decisions with a scripted clock and token source: TTFB order, starvation bound,
deadline choice, overload, timeouts, slow consumers, engine errors."""

from __future__ import annotations

import pytest

from lyre.config import load_config
from lyre.core.admission import AdmissionGate, Overloaded
from lyre.core.policy import DeadlinePolicy, FairPolicy
from lyre.core.scheduler import Scheduler
from lyre.core.session import ChunkEvent, DoneEvent, Segment, Session
from lyre.engine.base import GenerationRequest, SamplingParams
from tests.support.fakes import FakeClock, FakeTokenEngine, silent_pipeline


def make(policy="fair", capacity=4, batch=2, tokens=70, **sched):
    cfg = load_config(None, {"scheduler.policy": policy, "scheduler.max_concurrent_sessions": capacity,
                             "scheduler.max_batch_size": batch, **{f"scheduler.{k}": v for k, v in sched.items()}})
    clock = FakeClock()
    engine = FakeTokenEngine(capacity=capacity, max_batch_size=batch, tokens_per_request=tokens)
    gate = AdmissionGate(capacity, cfg.scheduler.max_pending)
    sch = Scheduler(cfg.scheduler, engine, silent_pipeline(), gate, clock=clock)
    return sch, engine, clock, gate


def open_session(sch, gate, clock, name, segments=1, reads=True):
    """A session whose client takes every chunk as it comes (``reads``) or reads nothing itself."""
    events: list = []

    def sink(ev):
        events.append(ev)
        if reads and isinstance(ev, ChunkEvent):
            s.consumed_samples += len(ev.pcm)

    gate.enter()
    s = Session(name, [Segment([1, 2, 3]) for _ in range(segments)], SamplingParams(), sink, clock())
    sch.submit(s)
    return s, events


def run(sch, clock, steps, dt=0.01):
    for _ in range(steps):
        sch.step()
        clock.advance(dt)


def done(events) -> DoneEvent | None:
    return next((e for e in events if isinstance(e, DoneEvent)), None)


def test_new_sessions_go_first_then_round_robin():
    sch, engine, clock, gate = make(capacity=4, batch=2)
    old = [open_session(sch, gate, clock, f"old{i}")[0] for i in range(3)]
    run(sch, clock, 60)  # 2 per step among 3: each is past ttfb_priority_tokens (20)
    assert all(s.tokens >= 20 for s in old)
    new, _ = open_session(sch, gate, clock, "new")
    engine.chosen_log.clear()
    run(sch, clock, 10)
    assert all("new#0" in chosen for chosen in engine.chosen_log[:10])  # every step until 20 tokens
    engine.chosen_log.clear()
    run(sch, clock, 12)
    counts = {f"old{i}#0": sum(f"old{i}#0" in c for c in engine.chosen_log) for i in range(3)}
    assert max(counts.values()) - min(counts.values()) <= 1  # round-robin among the rest


def test_no_session_waits_more_than_max_wait_steps_even_under_a_stream_of_new_ones():
    sch, engine, clock, gate = make(capacity=8, batch=2, max_wait_steps=3, tokens=400)
    veteran, _ = open_session(sch, gate, clock, "veteran")
    run(sch, clock, 25)  # past the new-session priority
    for i in range(7):
        open_session(sch, gate, clock, f"n{i}")
    engine.chosen_log.clear()
    run(sch, clock, 40)
    gaps, last = [], -1
    for step, chosen in enumerate(engine.chosen_log):
        if "veteran#0" in chosen:
            gaps.append(step - last)
            last = step
    assert gaps and max(gaps) <= 4  # waited at most max_wait_steps steps between turns


def test_deadline_policy_serves_the_session_about_to_run_dry():
    sch, engine, clock, gate = make(policy="deadline", capacity=4, batch=1, tokens=400)
    ahead, _ = open_session(sch, gate, clock, "ahead")
    dry, _ = open_session(sch, gate, clock, "dry")
    run(sch, clock, 60, dt=0.001)  # both past their first audio and priority tokens
    assert ahead.first_audio_at is not None and dry.first_audio_at is not None
    ahead.audio_samples += 24000 * 5  # its listener holds 5 s more audio
    engine.chosen_log.clear()
    run(sch, clock, 10, dt=0.001)
    assert all(c == ["dry#0"] for c in engine.chosen_log)
    assert DeadlinePolicy(sch.cfg).order([ahead, dry], step=sch.step_count, now=clock())[0] is dry
    assert FairPolicy(sch.cfg).order([dry, ahead], step=sch.step_count, now=clock())[0] is ahead  # round-robin


def test_overload_is_refused_at_once_with_a_retry_estimate():
    gate = AdmissionGate(max_active=2, max_pending=1)
    for _ in range(3):
        gate.enter()
    with pytest.raises(Overloaded) as info:
        gate.enter()
    assert info.value.retry_after_s > 0 and "retry after" in str(info.value)
    gate.leave(duration_s=4.0)
    gate.enter()  # a place came free


def test_pending_queue_is_served_in_order_as_slots_free():
    sch, engine, clock, gate = make(capacity=2, batch=2, tokens=14)
    sessions = [open_session(sch, gate, clock, f"s{i}") for i in range(5)]
    run(sch, clock, 1)
    assert len(sch.active) == 2 and len(sch.pending) == 3
    run(sch, clock, 200)
    assert [done(ev).outcome for _, ev in sessions] == ["finished"] * 5
    firsts = [s.first_audio_at for s, _ in sessions]
    assert firsts == sorted(firsts)
    assert gate.inside == 0 and not sch.active and not engine.has_work()


def test_a_freed_slot_goes_to_a_continuation_first_and_a_refused_session_waits_first_in_line():
    sch, engine, clock, gate = make(capacity=2, batch=2, tokens=14, reserved_slots=1)
    y, y_ev = open_session(sch, gate, clock, "y", segments=2)
    run(sch, clock, 1)  # y#0 holds a slot; the other is reserved for new sessions: no look-ahead
    assert engine.add(GenerationRequest("outsider", [1, 2, 3]))  # holds the other slot (never in the order)
    z, z_ev = open_session(sch, gate, clock, "z")
    run(sch, clock, 1)
    assert z.status == "pending" and list(sch.pending) == [z] and not z.segments[0].submitted  # add said no slot
    for _ in range(100):
        run(sch, clock, 1)
        if y.segments[0].done_generating:
            break
    run(sch, clock, 1)
    assert y.segments[1].submitted and z.status == "pending"  # the continuation took y#0's slot, z still waits
    engine.cancel("outsider")
    run(sch, clock, 2)  # the engine frees the slot at its step; z takes it at the next
    assert z.status == "active" and list(sch.pending) == []
    run(sch, clock, 200)
    assert done(y_ev).outcome == done(z_ev).outcome == "finished"


def test_a_request_the_engine_refuses_as_invalid_fails_its_session_and_admission_goes_on():
    sch, engine, clock, gate = make(capacity=2)
    engine.add(GenerationRequest("dup#0", [1, 2, 3]))  # the fake engine refuses a second "dup#0"
    bad, b_ev = open_session(sch, gate, clock, "dup")
    good, g_ev = open_session(sch, gate, clock, "good")
    run(sch, clock, 1)
    assert done(b_ev).outcome == "failed" and "request refused by the engine" in done(b_ev).reason
    assert good.status == "active" and not sch.pending and "dup" not in sch.active


def listen(sch, clock, s, seconds, dt=0.002, speed=1.0, until=None):
    """Step for ``seconds`` of the test's clock while ``s``'s client reads at ``speed`` x playback
    speed from its first chunk on (never more than was delivered). Returns the most audio that
    waited unread, in seconds."""
    most_unread = 0.0
    for _ in range(int(seconds / dt)):
        sch.step()
        clock.advance(dt)
        if s.first_audio_at is not None:
            due = int(speed * (clock() - s.first_audio_at) * 24000)
            s.consumed_samples = min(s.audio_samples, max(s.consumed_samples, due))
        most_unread = max(most_unread, s.unread_seconds)
        if s.status != "active" or (until is not None and until()):
            break
    return most_unread


def test_a_client_reading_at_playback_speed_is_never_cut_off_and_its_backlog_stays_bounded():
    # the server generates ~6x faster than real time; the utterance (25.6 s) outlasts session_timeout_s
    sch, engine, clock, gate = make(capacity=2, tokens=7 * 300, consumer_timeout_s=2.0, session_timeout_s=5.0,
                                    max_buffer_s=1.0)
    s, events = open_session(sch, gate, clock, "listener", reads=False)
    most_unread = listen(sch, clock, s, seconds=40.0)
    assert done(events) is not None and done(events).outcome == "finished"
    assert s.audio_samples == 300 * 2048  # every frame delivered
    assert most_unread <= 1.0 + 8 * 2048 / 24000  # max_buffer_s plus at most one chunk
    assert clock() - s.created > 20.0  # it ran far longer than session_timeout_s: only a lack of progress counts


def test_a_listener_does_not_pay_for_its_servers_stall():
    """The engine thread held for 5 s (a step that took far longer than the audio it had to cover, a
    starved process) while its client, a player, played out what it had and then waited: the
    listener's clock waited with the server, so the player (back at playback speed once audio
    comes again) is not cut as a slow consumer."""
    sch, engine, clock, gate = make(capacity=2, tokens=7 * 300, consumer_timeout_s=2.0, session_timeout_s=30.0,
                                    max_buffer_s=1.0)
    s, events = open_session(sch, gate, clock, "listener", reads=False)

    def play(seconds: float, dt: float = 0.002) -> None:  # reads at playback speed what has come, never more
        for _ in range(int(seconds / dt)):
            sch.step()
            clock.advance(dt)
            if s.first_audio_at is not None:
                s.consumed_samples = min(s.audio_samples, s.consumed_samples + round(dt * 24000))
            if s.status != "active":
                return

    play(3.0)
    assert s.throttled  # the server is ~1 s of audio ahead of its player: it waits on the client ...
    clock.advance(5.0)  # ... then stalls itself for 5 s: no step
    s.consumed_samples = s.audio_samples  # meanwhile the player played out all it had, and waited
    play(60.0)
    assert done(events).outcome == "finished" and s.audio_samples == 300 * 2048


def test_a_listener_does_not_pay_for_its_event_loops_lateness():
    """The engine thread runs on, but the event loop that writes audio to the clients is starved for
    5 s (its heartbeat stops): the client reads nothing meanwhile, through no fault of its own. Its
    listener's clock pauses while the loop is late, so once the loop beats again and the client reads
    at playback speed, it is not cut; the same client with the loop on time all along is cut."""
    assert listener_through_a_silent_spell(loop_starved=True) == ("finished", None)
    assert listener_through_a_silent_spell(loop_starved=False) == ("cancelled", "slow_consumer")


def listener_through_a_silent_spell(loop_starved: bool, dt: float = 0.002) -> tuple[str, str | None]:
    """A player that reads nothing for 5 s (its event loop starved, or not), then at playback speed."""
    sch, engine, clock, gate = make(capacity=2, tokens=7 * 300, consumer_timeout_s=2.0, session_timeout_s=30.0,
                                    max_buffer_s=1.0)
    s, events = open_session(sch, gate, clock, "listener", reads=False)
    for phase, seconds in (("playing", 1.0), ("silent", 5.0), ("playing", 60.0)):
        for _ in range(int(seconds / dt)):
            if phase == "playing" or not loop_starved:
                sch.loop_beat = clock()  # the event loop is on time
            sch.step()
            clock.advance(dt)
            if phase == "playing" and s.first_audio_at is not None:
                s.consumed_samples = min(s.audio_samples, s.consumed_samples + round(dt * 24000))
    return done(events).outcome, done(events).reason


def test_a_client_that_stops_reading_is_cut_off_once_it_is_consumer_timeout_s_behind_its_clock():
    sch, engine, clock, gate = make(capacity=2, tokens=10_000, consumer_timeout_s=2.0, max_buffer_s=1.0)
    reader, r_events = open_session(sch, gate, clock, "reader")  # takes every chunk at once
    stalled, s_events = open_session(sch, gate, clock, "stalled", reads=False)
    listen(sch, clock, stalled, seconds=10.0, speed=0.0)
    assert done(s_events).outcome == "cancelled" and done(s_events).reason == "slow_consumer"
    assert 2.0 < clock() - stalled.first_audio_at < 2.1
    assert stalled.unread_seconds <= 1.0 + 8 * 2048 / 24000  # generation stopped while it read nothing
    assert done(r_events) is None and reader.status == "active"  # the reader is unaffected
    assert engine.stats().active == 1 and gate.inside == 1  # the slot is free


def test_a_client_reading_at_half_speed_is_cut_off_when_it_falls_consumer_timeout_s_behind():
    sch, engine, clock, gate = make(capacity=2, tokens=10_000, consumer_timeout_s=2.0, max_buffer_s=1.0)
    slow, events = open_session(sch, gate, clock, "slow", reads=False)
    listen(sch, clock, slow, seconds=10.0, speed=0.5)
    assert done(events).reason == "slow_consumer"
    assert 3.9 < clock() - slow.first_audio_at < 4.6  # it read 0.5 s per second of its clock: 2 s behind after ~4 s


def test_a_listener_of_faster_speech_plays_at_its_tempo():
    """A response at speed 1.5 is played 1.5 s of audio a second: its listener's clock runs so. A client
    reading it at that pace is never cut; one reading at 1x falls 0.5 s behind a second and is cut
    (a clock at 1x would never see it fall behind, nor how little audio the fast player holds)."""
    for speed, cut in ((1.5, False), (1.0, True)):
        sch, engine, clock, gate = make(capacity=2, tokens=7 * 300, consumer_timeout_s=2.0, max_buffer_s=1.0)
        s, events = open_session(sch, gate, clock, "fast", reads=False)
        s.tempo = 1.5
        listen(sch, clock, s, seconds=60.0, speed=speed)
        assert (done(events).reason == "slow_consumer") == cut, speed
        if cut:
            assert clock() - s.first_audio_at < 8.0  # 2 s behind after ~4 s (and the server's buffer)
        else:
            assert done(events).outcome == "finished" and s.late_chunks == 0


def test_a_client_that_read_ahead_may_pause():
    sch, engine, clock, gate = make(capacity=2, tokens=7 * 150, consumer_timeout_s=2.0, max_buffer_s=1.0)
    s, events = open_session(sch, gate, clock, "reader", reads=False)

    def step(seconds, read):
        for _ in range(int(seconds / 0.002)):
            sch.step()
            clock.advance(0.002)
            if read:
                s.consumed_samples = s.audio_samples

    step(1.0, read=True)  # takes everything as it comes: ~6 s of audio in 1 s
    assert s.consumed_samples > 5 * 24000
    step(4.0, read=False)  # pauses 4 s, longer than consumer_timeout_s, while ahead of its clock
    assert done(events) is None
    step(10.0, read=True)
    assert done(events).outcome == "finished" and s.audio_samples == 150 * 2048


def test_a_session_without_progress_times_out_and_frees_its_slot():
    # its client reads nothing, and after max_buffer_s of audio the server stops generating for it
    sch, engine, clock, gate = make(capacity=2, tokens=10_000, session_timeout_s=5.0, consumer_timeout_s=100.0,
                                    max_buffer_s=1.0)
    s, events = open_session(sch, gate, clock, "idle", reads=False)
    listen(sch, clock, s, seconds=20.0, speed=0.0)
    assert done(events).reason == "timeout"
    assert 5.0 < clock() - s.last_token_at < 5.1
    assert engine.stats().active == 0 and gate.inside == 0


def test_a_pending_session_times_out_in_the_queue():
    sch, engine, clock, gate = make(capacity=1, batch=1, tokens=10_000, session_timeout_s=5.0)
    open_session(sch, gate, clock, "busy")
    waiting, events = open_session(sch, gate, clock, "waiting")
    run(sch, clock, 600, dt=0.01)
    assert done(events).reason == "timeout" and waiting.tokens == 0


def test_a_session_far_ahead_of_its_listener_yields_to_sessions_that_need_audio():
    sch, engine, clock, gate = make(capacity=4, batch=4, tokens=10_000, max_buffer_s=1.0, consumer_timeout_s=100.0)
    ahead, _ = open_session(sch, gate, clock, "ahead")  # its client takes everything: it is never throttled
    run(sch, clock, 500, dt=0.002)
    assert ahead.slack() > 3.0
    newcomer, _ = open_session(sch, gate, clock, "new")
    engine.chosen_log.clear()
    while newcomer.slack() <= 1.0:
        run(sch, clock, 1, dt=0.002)
    while_needed = engine.chosen_log[:-1]
    assert len(while_needed) > 20 and all(chosen == ["new#0"] for chosen in while_needed[1:])
    engine.chosen_log.clear()
    run(sch, clock, 20, dt=0.002)  # nobody needs audio now: both run
    assert all(sorted(chosen) == ["ahead#0", "new#0"] for chosen in engine.chosen_log)


def playing(name: str, slack_s: float, tokens: int = 500) -> Session:
    """A session past its first audio whose listener holds ``slack_s`` of unplayed audio."""
    s = Session(name, [Segment([1])], SamplingParams(), lambda ev: None, 0.0, tokens=tokens, first_audio_at=0.0)
    s.audio_samples, s.played_s = int((10.0 + slack_s) * 24000), 10.0
    return s


@pytest.mark.parametrize("policy", [FairPolicy, DeadlinePolicy])
def test_while_a_session_waits_for_its_first_audio_only_those_about_to_run_dry_run_beside_it(policy):
    cfg = load_config(None, {"scheduler.max_buffer_s": 2.0, "scheduler.first_audio_slack_s": 0.5}).scheduler
    dry, comfortable = playing("dry", 0.2), playing("comfortable", 1.5)
    new = playing("new", 0.0, tokens=3)
    new.first_audio_at = None  # no audio yet
    assert {s.session_id for s in policy(cfg).decode_order([dry, comfortable, new], 0, 0.0)} == {"new", "dry"}
    new.tokens = cfg.ttfb_priority_tokens  # past its first audio: everyone who needs audio runs again
    assert {s.session_id for s in policy(cfg).decode_order([dry, comfortable, new], 0, 0.0)} == {
        "new", "dry", "comfortable"}
    off = load_config(None, {"scheduler.max_buffer_s": 2.0, "scheduler.first_audio_slack_s": 0}).scheduler
    new.tokens = 3
    assert len(policy(off).decode_order([dry, comfortable, new], 0, 0.0)) == 3


def test_cancel_pending_and_active_sessions():
    sch, engine, clock, gate = make(capacity=1, batch=1)
    a, a_ev = open_session(sch, gate, clock, "a")
    b, b_ev = open_session(sch, gate, clock, "b")
    run(sch, clock, 3)
    sch.cancel("b")  # pending
    sch.cancel("a")  # active
    run(sch, clock, 2)
    assert (done(a_ev).outcome, done(b_ev).outcome) == ("cancelled", "cancelled")
    assert gate.inside == 0 and not engine.has_work()


def test_an_engine_error_fails_only_its_session():
    sch, engine, clock, gate = make(capacity=4, batch=4, tokens=20)
    engine.fail_request = "bad#0"
    good, g_ev = open_session(sch, gate, clock, "good")
    bad, b_ev = open_session(sch, gate, clock, "bad")
    run(sch, clock, 100)
    assert done(b_ev).outcome == "failed" and "simulated device fault" in done(b_ev).reason
    assert done(g_ev).outcome == "finished"


@pytest.mark.parametrize("fault", [ValueError("bad sampling values"), RuntimeError("the engine broke")])
def test_a_later_segment_refused_by_the_engine_fails_only_its_session(fault):
    """Its refusal comes while the scheduler walks its active sessions (continuations, look-ahead)."""
    sch, engine, clock, gate = make(capacity=4, batch=4, tokens=21)
    add = engine.add
    engine.add = lambda r: (_ for _ in ()).throw(fault) if r.request_id == "bad#1" else add(r)
    bad, b_ev = open_session(sch, gate, clock, "bad", segments=3)
    others = [open_session(sch, gate, clock, name, segments=2) for name in ("x", "y")]
    run(sch, clock, 200)
    assert done(b_ev).outcome == "failed" and str(fault) in done(b_ev).reason
    assert [done(ev).outcome for _, ev in others] == ["finished", "finished"]
    assert gate.inside == 0 and not engine.has_work()


def test_a_consumer_that_cannot_take_events_is_cancelled_alone():
    sch, engine, clock, gate = make(capacity=4, batch=4, tokens=21)
    gone, _ = open_session(sch, gate, clock, "gone")
    gone.sink = lambda ev: (_ for _ in ()).throw(RuntimeError("Event loop is closed"))
    fine, f_ev = open_session(sch, gate, clock, "fine")
    run(sch, clock, 100)
    assert gone.status == "cancelled" and gone.cancel_reason == "delivery_failed"
    assert done(f_ev).outcome == "finished" and gate.inside == 0 and not engine.has_work()


def test_a_client_is_not_a_slow_consumer_because_its_server_was_slow():
    """No audio for longer than consumer_timeout_s (the server was overloaded), then a chunk the
    client's handler takes a step later: the wait was the server's, so the client is not slow."""
    sch, engine, clock, gate = make(capacity=4, batch=4, tokens=70)
    s, events = open_session(sch, gate, clock, "patient", reads=False)

    def step_until_new_audio():
        before = s.audio_samples
        while s.audio_samples == before:
            sch.step()
            clock.advance(0.01)

    step_until_new_audio()
    s.consumed_samples = s.audio_samples  # the client takes everything ...
    sch.step()  # ... and the engine thread sees that it did
    s.consumed_samples = s.audio_samples
    clock.advance(15.0)  # the server's next step came 15 s later (> consumer_timeout_s = 10)
    step_until_new_audio()
    sch.step()  # the engine thread looks again before the client's handler has taken the new chunk
    assert s.status == "active" and s.unread_seconds > 0
    while done(events) is None:
        s.consumed_samples = s.audio_samples
        sch.step()
        clock.advance(0.01)
    assert done(events).outcome == "finished"


def test_look_ahead_leaves_the_reserved_slots_to_new_sessions():
    sch, engine, clock, gate = make(capacity=4, batch=4, tokens=21, reserved_slots=3)
    open_session(sch, gate, clock, "long", segments=3)
    run(sch, clock, 2)
    assert engine.stats().active + engine.stats().waiting == 1  # 3 spare slots, all reserved: no look-ahead
    newcomer, events = open_session(sch, gate, clock, "new")
    run(sch, clock, 1)
    assert newcomer.tokens > 0  # it got a slot at once


def test_segments_generate_in_order_and_the_next_prefills_early():
    sch, engine, clock, gate = make(capacity=4, batch=4, tokens=21)
    s, events = open_session(sch, gate, clock, "long", segments=3)
    run(sch, clock, 2)
    assert engine.stats().active + engine.stats().waiting == 2  # segment 1 prefilled ahead
    decoded_second_before_first_done = any("long#1" in c for c in engine.chosen_log[:21])
    run(sch, clock, 200)
    assert not decoded_second_before_first_done
    chunks = [e for e in events if isinstance(e, ChunkEvent)]
    assert done(events).outcome == "finished"
    assert sum(len(c.pcm) for c in chunks) == 3 * 3 * 2048  # 21 tokens = 3 frames per segment
    assert [c.offset for c in chunks] == [sum(len(x.pcm) for x in chunks[:i]) for i in range(len(chunks))]


def test_a_piece_generated_ahead_waits_for_its_turn_without_being_a_slow_consumer():
    """An utterance's next piece is generated while the one before it is heard: nobody reads it for
    as long as that piece plays (longer than consumer_timeout_s here). Its listener starts at its
    first read, so it waits (throttled at max_buffer_s) instead of being cut off."""
    sch, engine, clock, gate = make(capacity=2, tokens=7 * 300, consumer_timeout_s=2.0, max_buffer_s=1.0)
    heard, heard_events = open_session(sch, gate, clock, "heard", reads=False)
    ahead, ahead_events = open_session(sch, gate, clock, "ahead", reads=False)
    ahead.listen_on_read = True
    listen(sch, clock, heard, seconds=8.0)  # the first piece plays for 8 s, read at playback speed
    assert ahead.status == "active" and done(ahead_events) is None and ahead.throttled  # waiting, not cut off
    assert ahead.unread_seconds <= 1.0 + 8 * 2048 / 24000 and ahead.late_chunks == 0
    listen(sch, clock, ahead, seconds=40.0)  # its turn: read at playback speed to the end
    assert done(ahead_events).outcome == "finished" and ahead.audio_samples == 300 * 2048


def test_a_piece_whose_turn_came_is_held_to_its_listener_like_any_stream():
    sch, engine, clock, gate = make(capacity=2, tokens=10_000, consumer_timeout_s=2.0, max_buffer_s=1.0)
    piece, events = open_session(sch, gate, clock, "piece", reads=False)
    piece.listen_on_read = True
    run(sch, clock, 100)
    piece.consumed_samples = 2048  # read once: its listener is playing now ...
    listen(sch, clock, piece, seconds=10.0, speed=0.0)  # ... and it reads nothing more
    assert done(events).reason == "slow_consumer"
