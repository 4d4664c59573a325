"""Accounts share the server: one account's backlog never holds every KV slot or delays another
account's first slot, free slots go to waiting accounts by weight, and each account is refused
past its quota (naming it) while others still come in. A scripted clock and token source (the
fake stands in for the GPU engine: only the scheduling decisions are under test)."""

from __future__ import annotations

import pytest

from lyre.config import load_config
from lyre.core.admission import AdmissionGate
from lyre.core.scheduler import Scheduler
from lyre.core.session import ChunkEvent, Segment, Session
from lyre.engine.base import SamplingParams
from lyre.errors import QuotaExceeded
from lyre.trust.quotas import Quotas
from tests.support.fakes import FakeClock, FakeTokenEngine, silent_pipeline


def make(capacity=4, tokens=70, accounts=("attacker", "victim"), **settings):
    cfg = load_config(None, {"scheduler.max_concurrent_sessions": capacity, "scheduler.max_batch_size": capacity,
                             "scheduler.max_pending": 32, **settings})
    clock = FakeClock()
    quotas = Quotas(cfg, accounts)
    gate = AdmissionGate(capacity, cfg.scheduler.max_pending, quotas.of)
    engine = FakeTokenEngine(capacity=capacity, max_batch_size=capacity, tokens_per_request=tokens)
    return Scheduler(cfg.scheduler, engine, silent_pipeline(), gate, clock=clock), gate, clock


def submit(sch, gate, clock, account, name):
    def sink(ev):
        if isinstance(ev, ChunkEvent):
            s.consumed_samples += len(ev.pcm)

    gate.enter(account)
    s = Session(name, [Segment([1, 2, 3])], SamplingParams(), sink, clock(), account=account)
    sch.submit(s)
    return s


def step(sch, clock, n=1):
    for _ in range(n):
        sch.step()
        clock.advance(0.01)


def test_one_accounts_backlog_leaves_room_for_anothers_first_request():
    sch, gate, clock = make(capacity=4, tokens=5000)  # long utterances: no slot frees on its own
    flood = [submit(sch, gate, clock, "attacker", f"a{i}") for i in range(20)]
    step(sch, clock, 3)
    held = sum(s.session_id in sch.active for s in flood)
    assert held == 3  # 3/4 of the slots: its quota with two accounts (accounts.max_sessions derived)
    victim = submit(sch, gate, clock, "victim", "v")
    step(sch, clock)
    assert victim.session_id in sch.active  # at once, ahead of the attacker's 17 queued
    sch.publish()
    mine = sch.snapshot.accounts
    assert (mine["attacker"].active_sessions, mine["attacker"].pending_sessions) == (3, 17)
    assert (mine["victim"].active_sessions, mine["victim"].pending_sessions) == (1, 0)


def test_free_slots_go_to_waiting_accounts_by_weight():
    sch, gate, clock = make(capacity=4, tokens=7, accounts=("heavy", "light"),
                            **{"accounts.quotas": {"heavy": {"weight": 3.0}}, "accounts.default.max_sessions": 4})
    sessions = [submit(sch, gate, clock, account, f"{account}{i}") for i in range(16) for account in ("heavy", "light")]
    admitted = []
    seen = set()
    for _ in range(200):
        step(sch, clock)
        for s in sessions:
            if s.session_id not in seen and (s.session_id in sch.active or s.status != "pending"):
                seen.add(s.session_id)
                admitted.append(s.account)
        if len(admitted) >= 16:
            break
    first = admitted[:16]
    assert first.count("heavy") == pytest.approx(12, abs=1)  # 3 : 1 while both wait
    assert first.count("light") >= 3  # the light account is never starved


def test_an_account_at_its_quota_is_refused_naming_it_while_another_comes_in():
    sch, gate, clock = make(capacity=4, **{"scheduler.max_pending": 8})
    for i in range(3 + 6):  # 3/4 of 4 slots + 3/4 of 8 queued places
        submit(sch, gate, clock, "attacker", f"a{i}")
    with pytest.raises(QuotaExceeded) as refused:
        gate.enter("attacker")
    assert "accounts.max_sessions + accounts.max_queued" in str(refused.value) and "'attacker'" in str(refused.value)
    assert refused.value.retry_after_s > 0
    submit(sch, gate, clock, "victim", "v")  # the server is not full: another account comes in


def test_a_lone_account_may_use_the_whole_server():
    cfg = load_config(None, {"scheduler.max_concurrent_sessions": 8, "scheduler.max_batch_size": 8,
                             "scheduler.max_pending": 10})
    only = Quotas(cfg, ("default",)).of("default")
    assert (only.max_sessions, only.max_queued) == (8, 10)
    shared = Quotas(cfg, ("a", "b")).of("a")
    assert (shared.max_sessions, shared.max_queued) == (6, 7)
    given = Quotas(load_config(None, {"accounts.default.max_sessions": 2, "accounts.quotas": {"a": {"weight": 2.0}}}),
                   ("a", "b"))
    assert (given.of("a").max_sessions, given.of("a").weight) == (2, 2.0)  # the default's, and its own weight
    assert given.of("b").weight == 1.0


def test_accounts_take_turns_and_the_first_turn_rotates():
    from lyre.core.fair import by_account

    ordered = ["a1", "a2", "a3", "v1", "a4"]  # most urgent first: one account's many ahead of another's one
    assert by_account(ordered, lambda x: x[0]) == ["a1", "v1", "a2", "a3", "a4"]
    # a round that has room for only one job still reaches the other account every other round
    firsts = [by_account(ordered, lambda x: x[0], turn)[0] for turn in range(4)]
    assert firsts == ["a1", "v1", "a1", "v1"]
    assert by_account(["a1", "a2"], lambda x: x[0], 3) == ["a1", "a2"]  # one account: its own order
