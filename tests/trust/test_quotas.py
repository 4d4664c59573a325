"""Per-account counters on the asyncio side: places (WebSocket contexts, enrollments, verifications)
are refused past the quota, naming it, and come back when released; characters per minute are
counted over a sliding minute of a controlled clock."""

from __future__ import annotations

import pytest

from lyre.config import load_config
from lyre.errors import QuotaExceeded, TextTooLong
from lyre.trust.quotas import Quotas
from tests.support.fakes import FakeClock


def test_places_are_refused_past_the_quota_and_come_back_once_released():
    refusals = []
    quotas = Quotas(load_config(None, {"accounts.quotas": {"a": {"max_enrollments": 2}}}), ("a", "b"),
                    on_refusal=lambda account, key: refusals.append((account, key)))
    first, second = quotas.take("a", "enrollments"), quotas.take("a", "enrollments")
    with pytest.raises(QuotaExceeded, match=r"account 'a' is at its quota: at most 2 enrollments in flight "
                                            r"\(accounts.max_enrollments\)"):
        quotas.take("a", "enrollments")
    assert refusals == [("a", "accounts.max_enrollments")]
    with quotas.hold("b", "enrollments"):  # another account's own places
        pass
    first()
    first()  # a second release changes nothing
    quotas.take("a", "enrollments")
    with pytest.raises(QuotaExceeded):
        quotas.take("a", "enrollments")
    second()


def test_characters_per_minute_slide_with_the_clock():
    clock = FakeClock()
    quotas = Quotas(load_config(None, {"accounts.default.chars_per_minute": 100}), ("a", "b"), clock=clock)
    quotas.charge_chars("a", 60)
    clock.advance(20)
    quotas.charge_chars("a", 40)
    with pytest.raises(QuotaExceeded, match="accounts.chars_per_minute") as refused:
        quotas.charge_chars("a", 30)
    assert refused.value.retry_after_s == pytest.approx(40)  # when the first 60 leave the minute
    quotas.charge_chars("b", 100)  # another account's minute is its own
    clock.advance(40)
    quotas.charge_chars("a", 30)
    with pytest.raises(TextTooLong, match="at most 100 a minute"):
        quotas.charge_chars("a", 101)  # can never fit: not a wait


def test_a_lone_account_is_everyone_and_gets_no_derived_bound_on_places():
    from lyre.config import ServerConfig
    from lyre.trust.accounts import Accounts
    from lyre.trust.quotas import UNBOUNDED

    assert Accounts(ServerConfig(api_keys={"k": "acme"})).names == ("acme",)  # no unreachable "default"
    lone = Quotas(load_config(None), ("default",)).of("default")
    assert lone.max_ws_contexts == lone.max_enrollments == lone.max_verifies == UNBOUNDED
    given = Quotas(load_config(None, {"accounts.default.max_verifies": 2}), ("default",)).of("default")
    assert given.max_verifies == 2  # what the operator sets still holds


def test_a_cancelled_caller_keeps_its_worker_place_until_its_job_has_ended():
    import asyncio
    import threading

    from lyre.errors import OverloadedError
    from lyre.service.workers import AudioWorkers

    async def go():
        workers = AudioWorkers(1, 1)
        started, finish = threading.Event(), threading.Event()

        def job():
            started.set()
            finish.wait(60)
            return 1

        async def caller():
            with workers.place():
                return await workers.run(job)

        task = asyncio.get_running_loop().create_task(caller())
        await asyncio.to_thread(started.wait, 60)
        task.cancel()
        await asyncio.sleep(0)  # (one turn: the cancellation reaches the caller)
        with pytest.raises(OverloadedError, match="voices.max_in_flight"):
            with workers.place():
                pass  # the job still runs: its place is not free
        finish.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        with workers.place():
            pass  # now it is
        workers.close()

    asyncio.run(go())


def test_waiting_audio_jobs_are_taken_one_account_at_a_time():
    import asyncio
    import threading

    from lyre.service.workers import AudioWorkers

    async def go():
        workers = AudioWorkers(1, 10)
        started, finish, ran = threading.Event(), threading.Event(), []

        def job(name):
            ran.append(name)
            if name == "flood0":
                started.set()
                finish.wait(60)

        flood = [asyncio.get_running_loop().create_task(workers.run(job, f"flood{i}", account="attacker"))
                 for i in range(4)]
        await asyncio.to_thread(started.wait, 60)  # the flood's first job holds the one worker
        mine = asyncio.get_running_loop().create_task(workers.run(job, "mine", account="victim"))
        await asyncio.sleep(0)  # (queued behind the flood's three waiting jobs)
        finish.set()
        await asyncio.gather(*flood, mine)
        workers.close()
        return ran

    assert asyncio.run(go()) == ["flood0", "mine", "flood1", "flood2", "flood3"]


def test_with_two_workers_another_accounts_job_never_waits_behind_one_accounts_encodes():
    import asyncio
    import threading

    from lyre.service.workers import AudioWorkers

    async def go():
        workers = AudioWorkers(2, 10)
        busy, finish, ran = threading.Event(), threading.Event(), []

        def long_job(name):
            ran.append(name)
            busy.set()
            finish.wait(60)

        flood = [asyncio.get_running_loop().create_task(workers.run(long_job, f"flood{i}", account="attacker"))
                 for i in range(3)]
        await asyncio.to_thread(busy.wait, 60)
        mine = await workers.run(lambda: "done", account="victim")  # the second worker is not the flood's
        started = list(ran)
        finish.set()
        await asyncio.gather(*flood)
        workers.close()
        return mine, started

    mine, started = asyncio.run(go())
    assert mine == "done" and started == ["flood0"]  # the flood's others waited for its one worker
