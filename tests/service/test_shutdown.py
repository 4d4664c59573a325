"""A request that arrives while the service closes gets ServiceUnavailable at once and releases its
admission place. The interleavings are forced: the engine thread is held inside a message while
the close begins, so nothing depends on timing."""

from __future__ import annotations

import threading

import pytest

from lyre.errors import ServiceUnavailable, SynthesisFailed
from tests.support.services import run, service


async def _hold_engine_thread(tts, then=None) -> threading.Event:
    """Park the engine thread inside a message until the returned event is set (then call ``then``)."""
    release, parked = threading.Event(), threading.Event()

    def hold():
        parked.set()
        release.wait()
        if then is not None:
            then()

    assert tts._loop.post(hold)
    parked.wait()
    return release


def test_a_request_after_the_close_began_is_refused_at_once():
    async def go():
        async with service() as tts:
            release = await _hold_engine_thread(tts)
            tts._loop.request_stop()  # the close has begun; the engine thread has not seen it yet
            with pytest.raises(ServiceUnavailable, match="shutting down|not running"):
                tts.stream("too late")
            with pytest.raises(ServiceUnavailable):
                tts.utterance()
            assert tts.gate.inside == 0
            release.set()
        return tts

    tts = run(go())
    assert tts.gate.inside == 0 and not tts._loop.thread.is_alive()


def test_a_request_queued_before_the_close_ends_with_service_unavailable():
    async def go():
        async with service() as tts:
            release = await _hold_engine_thread(tts)
            queued = tts.stream("queued before the close", seed=1)  # its submit waits behind the hold
            assert tts.gate.inside == 1
            tts._loop.request_stop()
            release.set()
            with pytest.raises(ServiceUnavailable, match="shut down before this synthesis finished"):
                _ = [c async for c in queued]
            assert tts.gate.inside == 0

    run(go())


def test_a_request_posted_to_a_dead_engine_loop_is_answered():
    """Messages queued when the loop dies are run against the shut-down scheduler, not dropped."""
    def die():
        raise SystemExit("the engine loop is gone")  # not a request's fault: it ends the loop

    async def go():
        async with service() as tts:
            release = await _hold_engine_thread(tts, then=die)
            queued = tts.stream("queued while the loop dies", seed=1)  # in the inbox behind the hold
            release.set()
            with pytest.raises(SynthesisFailed, match="the engine loop stopped: SystemExit"):
                _ = [c async for c in queued]
            assert tts.gate.inside == 0
            with pytest.raises(ServiceUnavailable):
                tts.stream("after")

    run(go())
