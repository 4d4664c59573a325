"""The victim of ``benchmark.py --mode isolation``: what another account's caller does while an attack
runs, and how it fared.

- REST speech syntheses (streamed 24 kHz PCM, ``max_tokens`` = ``min_tokens`` so complete audio has
  a known length) at ``concurrency``, each timed to its first audio byte: ``requests`` of them, and
  more until ``min_s`` have passed (so an attack has that long to do its harm);
- ``/health`` polled every ``health_every_s`` meanwhile (at least three times);
- watermark verifications of a short clip (``verify_probes``) and enrollments of a short clip
  (``enroll_probes``, each voice deleted again), one after another, spread over ``min_s``.

Every request opens a connection of its own (a new caller does), from ``VICTIM_ADDRESS``: a
loopback address of its own, so a limit per client address counts the victim apart from the
attacker. Nothing waits past ``deadline_s`` (what has not answered by then failed): a phase's
length is bounded whatever the attack does.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import aiohttp

from lyre.benchmarks.figures import percentile
from lyre.benchmarks.load import Player
from lyre.benchmarks.voices import generated_clip
from lyre.model import orpheus

VICTIM_ADDRESS = "127.0.0.3"
TEXT = "Thanks for calling, how can I help you today?"
TRANSCRIPT = "The quick brown fox jumps over the lazy dog, and then it runs back home again."
CONSENT = json.dumps({"granted": True, "speaker": "the benchmark's victim", "source": "self_recorded",
                      "statement": "benchmark.py --mode isolation"})
HEALTH_TIMEOUT_S = 5.0
RETRY_S = 0.25


@dataclass
class VictimSettings:
    requests: int = 12
    min_s: float = 20.0  # syntheses go on (past ``requests``) until this long has passed
    concurrency: int = 2
    max_tokens: int = 84  # per synthesis (1 s of audio)
    request_timeout_s: float = 30.0
    deadline_s: float = 90.0  # the victim's whole phase, at most
    health_every_s: float = 0.5
    verify_probes: int = 2
    enroll_probes: int = 1


@dataclass
class Call:
    kind: str  # speech | verify | enroll | health
    ok: bool
    ms: float | None = None  # speech: to the first audio byte; the others: to the answer
    error: str | None = None


def run(http: str, key: str, s: VictimSettings) -> dict[str, Any]:
    """The victim's phase: every call, and its figures."""
    calls = asyncio.run(_phase(http, key, s))
    return summary(calls)


def summary(calls: list[Call]) -> dict[str, Any]:
    def of(kind: str) -> list[Call]:
        return [c for c in calls if c.kind == kind]

    speech, health = of("speech"), of("health")
    ttfb = [c.ms for c in speech if c.ok]
    work = [c for c in calls if c.kind != "health"]
    return {
        "calls": len(work), "ok": sum(c.ok for c in work),
        "success_rate": sum(c.ok for c in work) / len(work) if work else None,
        "speech": {"requests": len(speech), "ok": sum(c.ok for c in speech),
                   "ttfb_ms_p50": percentile(ttfb, 0.5), "ttfb_ms_p95": percentile(ttfb, 0.95)},
        "verify": _probe_figures(of("verify")), "enroll": _probe_figures(of("enroll")),
        "health": {"polls": len(health), "ok": sum(c.ok for c in health),
                   "max_ms": max((c.ms for c in health), default=None)},  # a poll that timed out counts its timeout
        "errors": sorted({c.error for c in calls if c.error})[:8],
    }


def _probe_figures(calls: list[Call]) -> dict[str, Any]:
    return {"calls": len(calls), "ok": sum(c.ok for c in calls), "max_ms": max((c.ms for c in calls if c.ok),
                                                                                  default=None)}


async def _phase(http: str, key: str, s: VictimSettings) -> list[Call]:
    deadline = time.monotonic() + s.deadline_s
    auth = {"Authorization": f"Bearer {key}"}
    calls: list[Call] = []
    clip = generated_clip(2.0)
    enroll_clip = generated_clip(4.0)

    def session() -> aiohttp.ClientSession:  # a new connection per request, from the victim's address
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, local_addr=(VICTIM_ADDRESS, 0)),
                                     headers=auth)

    async def bounded(kind: str, make, timeout_s: float) -> Call:
        left = timeout_s if kind == "health" else min(timeout_s, deadline - time.monotonic())
        start = time.perf_counter()
        if left <= 0:
            call = Call(kind, False, error="not started: the phase's deadline had passed")
        else:
            try:
                call = await asyncio.wait_for(make(start), left)
            except asyncio.TimeoutError:
                call = Call(kind, False, 1000 * (time.perf_counter() - start), f"{kind}: no answer in {left:.0f} s")
            except (aiohttp.ClientError, OSError, ValueError) as e:
                call = Call(kind, False, 1000 * (time.perf_counter() - start), f"{kind}: {type(e).__name__}: {e}"[:200])
        calls.append(call)
        return call

    expected = s.max_tokens // orpheus.FRAME_TOKENS * orpheus.SAMPLES_PER_FRAME * 2  # pcm bytes

    async def speech(start: float) -> Call:
        player = Player(start)
        body = {"input": TEXT, "response_format": "pcm", "max_tokens": s.max_tokens, "min_tokens": s.max_tokens}
        async with session() as http_session, http_session.post(http + "/v1/audio/speech", json=body) as r:
            if r.status != 200:
                return Call("speech", False, error=f"speech: HTTP {r.status}: {(await r.text())[:120]}")
            got = 0
            async for chunk in r.content.iter_any():
                player.arrive(len(chunk))
                got += len(chunk)
        ttfb = None if player.first is None else 1000 * (player.first - start)
        return Call("speech", got == expected, ttfb, None if got == expected else f"speech: {got} of {expected} bytes")

    async def verify(start: float) -> Call:
        async with session() as http_session, http_session.post(http + "/v1/audio/verify", data=clip) as r:
            await r.read()
            return Call("verify", r.status == 200, 1000 * (time.perf_counter() - start),
                        None if r.status == 200 else f"verify: HTTP {r.status}")

    async def enroll(start: float) -> Call:
        form = aiohttp.FormData(default_to_multipart=True)
        form.add_field("audio", enroll_clip, filename="victim.wav")
        form.add_field("transcript", TRANSCRIPT)
        form.add_field("name", f"victim-{time.monotonic_ns()}")
        form.add_field("consent", CONSENT)
        async with session() as http_session:
            async with http_session.post(http + "/v1/voices", data=form) as r:
                ms = 1000 * (time.perf_counter() - start)
                if r.status != 201:
                    return Call("enroll", False, ms, f"enroll: HTTP {r.status}: {(await r.text())[:120]}")
                voice = (await r.json())["id"]
            async with http_session.delete(f"{http}/v1/voices/{voice}") as d:
                await d.read()
        return Call("enroll", True, ms)

    async def health(start: float) -> Call:
        async with session() as http_session, http_session.get(http + "/health") as r:
            await r.read()
            return Call("health", r.status == 200, 1000 * (time.perf_counter() - start),
                        None if r.status == 200 else f"health: HTTP {r.status}")

    started = time.monotonic()
    counter = itertools.count()

    async def user() -> None:
        # the first ``requests`` always (past the deadline each fails at once), more only within ``min_s``
        while next(counter) < s.requests or time.monotonic() - started < min(s.min_s, deadline - started):
            if not (await bounded("speech", speech, s.request_timeout_s)).ok:  # a caller refused waits a moment
                await asyncio.sleep(RETRY_S)

    async def probes() -> None:  # spread over ``min_s``
        plan = ["verify"] * s.verify_probes + ["enroll"] * s.enroll_probes
        for i, kind in enumerate(plan):
            await asyncio.sleep(max(0.0, min(started + i * s.min_s / len(plan), deadline) - time.monotonic()))
            await bounded(kind, verify if kind == "verify" else enroll, s.request_timeout_s)

    work = asyncio.gather(*(user() for _ in range(s.concurrency)), probes())
    polls = 0
    while not work.done() or polls < 3:
        if time.monotonic() > deadline and polls >= 3:
            break
        await bounded("health", health, HEALTH_TIMEOUT_S)
        polls += 1
        await asyncio.wait([work], timeout=s.health_every_s)
    await work
    return calls


def can_upload(http: str, key: str) -> bool:
    """Whether a verification of a short clip is taken now (200), not refused: the server's places
    for uploads are free again."""
    request = urllib.request.Request(http + "/v1/audio/verify", data=_short_clip(),
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "audio/wav"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status == 200
    except (OSError, ValueError):  # (a refusal is an HTTPError, an OSError)
        return False


@functools.lru_cache(maxsize=1)
def _short_clip() -> bytes:
    return generated_clip(1.0)
