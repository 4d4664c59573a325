"""``benchmark.py --mode batch-fill``: does a batch backlog fill idle capacity without hurting live callers?

One server (a ``python -m lyre serve`` process). First the capacity: a backlog of batch items alone,
for ``seconds``: the audio-seconds per second the server produces at full speed (``capacity``). Then,
at each live level (a share of that capacity), live callers in a closed loop — ``round(level x
capacity)`` users, each streaming REST speech of known length and listening to it (a simulated
real-time player) before asking the next — for ``seconds`` without a backlog, then for ``seconds`` with
a backlog of ``backlog`` batch items submitted at its start. Per level:

- live TTFB p95 with the backlog over without it (goal <= 1.1), and the live players' underruns
  (goal: none: live streams stay real time);
- batch throughput (audio-seconds of items completed per second) over what the live load leaves
  unused (capacity minus the live audio-seconds per second measured; goal >= 0.8).

Batch audio is the server's audio delivered in the phase (``lyre_audio_seconds``, read through
``/metrics``: counted as it is produced, not as items complete) less the live callers' audio; each
backlog is cancelled at the end of its phase.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from lyre.benchmarks.figures import percentile
from lyre.benchmarks.load import Player
from lyre.benchmarks.servers import ManagedServer

LIVE_TEXT = "Thanks for calling, how can I help you today?"
BATCH_TEXT = "Hello {i}, your appointment is confirmed for Tuesday at ten in the morning."


@dataclass
class BatchFillSettings:
    levels: tuple[float, ...] = (0.3, 0.7)
    backlog: int = 1000
    seconds: float = 40.0  # each phase
    live_tokens: int = 168  # per live request (2 s of audio; max = min, so its length is known)
    batch_tokens: int = 84  # per batch item (1 s)


def run(config: Path | None, overrides: tuple[str, ...], s: BatchFillSettings, progress=print) -> dict[str, Any]:
    with ManagedServer(config, (*overrides, "batch.poll_s=0.2")) as srv:
        return asyncio.run(_run(srv.http, s, progress))


async def _run(http: str, s: BatchFillSettings, progress) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        progress(f"batch-fill: capacity (a backlog of {s.backlog} items alone, {s.seconds:.0f} s) ...")
        capacity = (await _phase(session, http, s, users=0, backlog=True))["batch_audio_per_s"]
        levels = []
        for level in s.levels:
            users = max(1, round(level * capacity))
            progress(f"batch-fill: live load {level:.0%} of {capacity:.2f} audio-s/s = {users} users, without and "
                     "with the backlog ...")
            alone = await _phase(session, http, s, users=users, backlog=False)
            mixed = await _phase(session, http, s, users=users, backlog=True)
            unused = max(1e-9, capacity - alone["live_audio_per_s"])
            levels.append({
                "level": level, "users": users, "without": alone, "with": mixed,
                "ttfb_p95_ratio": _ratio(mixed["ttfb_p95_ms"], alone["ttfb_p95_ms"]),
                "unused_audio_per_s": unused, "batch_share_of_unused": mixed["batch_audio_per_s"] / unused,
            })
    return {"capacity_audio_per_s": capacity, "settings": vars(s), "levels": levels}


async def _phase(session: aiohttp.ClientSession, http: str, s: BatchFillSettings, users: int,
                 backlog: bool) -> dict[str, Any]:
    batch_id = await _submit(session, http, s) if backlog else None
    before, start = await _audio_delivered(session, http), time.monotonic()
    results: list[dict[str, Any]] = []

    async def user() -> None:  # a caller who listens to each answer before the next (real-time consumption)
        while time.monotonic() - start < s.seconds:
            results.append(await _speech(session, http, s.live_tokens))
            await asyncio.sleep(max(0.0, results[-1]["played_until"] - time.perf_counter()))

    await asyncio.gather(*(user() for _ in range(users)), asyncio.sleep(s.seconds))
    elapsed = time.monotonic() - start
    ok = [r for r in results if r["ok"]]
    live_audio = sum(r["audio_s"] for r in results)
    batch_audio = max(0.0, await _audio_delivered(session, http) - before - live_audio)
    if batch_id is not None:
        async with session.post(f"{http}/v1/batches/{batch_id}/cancel") as r:
            await r.read()
    await _settle(session, http)
    ttfbs = [r["ttfb_ms"] for r in ok if r["ttfb_ms"] is not None]
    return {"requests": len(results), "ok": len(ok), "ttfb_p50_ms": percentile(ttfbs, 0.5),
            "ttfb_p95_ms": percentile(ttfbs, 0.95), "underruns": sum(r["underruns"] for r in ok),
            "late_requests": sum(1 for r in ok if r["underruns"]), "elapsed_s": elapsed,
            "live_audio_per_s": live_audio / elapsed, "batch_audio_per_s": batch_audio / elapsed}


async def _submit(session: aiohttp.ClientSession, http: str, s: BatchFillSettings) -> str:
    data = "".join(json.dumps({"custom_id": f"b{i}", "input": BATCH_TEXT.format(i=i), "response_format": "wav",
                               "max_tokens": s.batch_tokens, "min_tokens": s.batch_tokens}) + "\n"
                   for i in range(s.backlog))
    async with session.post(f"{http}/v1/batches", data=data.encode(),
                            headers={"Content-Type": "application/jsonl"}) as r:
        body = await r.json()
        if r.status != 200:
            raise RuntimeError(f"the backlog was refused: HTTP {r.status}: {body}")
        return body["id"]


async def _speech(session: aiohttp.ClientSession, http: str, tokens: int) -> dict[str, Any]:
    start = time.perf_counter()
    player = Player(start)
    body = {"input": LIVE_TEXT, "response_format": "pcm", "max_tokens": tokens, "min_tokens": tokens}
    try:
        async with session.post(f"{http}/v1/audio/speech", json=body) as r:
            if r.status != 200:
                await r.read()
                return {"ok": False, "ttfb_ms": None, "underruns": 0, "audio_s": 0.0, "played_until": 0.0}
            async for chunk in r.content.iter_any():
                player.arrive(len(chunk))
    except aiohttp.ClientError:
        return {"ok": False, "ttfb_ms": None, "underruns": 0, "audio_s": 0.0, "played_until": 0.0}
    result = player.result()
    return {"ok": True, "ttfb_ms": result.ttfb_ms, "underruns": result.underruns, "audio_s": player.audio_s,
            "played_until": (player.first or start) + player.audio_s}


async def _audio_delivered(session: aiohttp.ClientSession, http: str) -> float:
    """Audio the engine has delivered so far, live and batch (as it is produced: not only items completed)."""
    async with session.get(f"{http}/metrics") as r:
        text = await r.text()
    return next((float(line.split()[1]) for line in text.splitlines()
                 if line.startswith("lyre_audio_seconds_total")), 0.0)


async def _settle(session: aiohttp.ClientSession, http: str, timeout_s: float = 120.0) -> None:
    """Until no session holds a KV slot (the cancelled backlog's items have left the lane)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with session.get(f"{http}/v1/stats") as r:
            stats = await r.json()
        if stats["kv_cache"]["used_slots"] == 0 and not stats["scheduler"].get("batch_waiting"):
            return
        await asyncio.sleep(0.2)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def table(result: dict[str, Any]) -> str:
    rows = [f"capacity (batch alone): {result['capacity_audio_per_s']:.2f} audio-s/s",
            "| live load | users | live TTFB p95 without / with backlog | ratio | live underruns without / with "
            "| live audio-s/s | batch audio-s/s | batch share of unused |",
            "|---|---|---|---|---|---|---|---|"]
    for lv in result["levels"]:
        a, b = lv["without"], lv["with"]
        ratio = "n/a" if lv["ttfb_p95_ratio"] is None else f"{lv['ttfb_p95_ratio']:.2f}x"
        rows.append(f"| {lv['level']:.0%} | {lv['users']} | {a['ttfb_p95_ms'] or 0:.0f} / {b['ttfb_p95_ms'] or 0:.0f} ms "
                    f"| {ratio} | {a['underruns']} / {b['underruns']} | {b['live_audio_per_s']:.2f} "
                    f"| {b['batch_audio_per_s']:.2f} | {lv['batch_share_of_unused']:.0%} |")
    return "\n".join(rows)

