"""``benchmark.py --mode soak``: the reliability suite, with figures.

- soak: ``requests`` over REST, WebSocket and gRPC in turn at ``concurrency``, a share of clients
  going away at a random moment (before the first byte, mid-stream, mid-context) and a share
  cancelling; afterwards no KV slot, session or codec state may be left, the server's RSS growth
  after warm-up is reported, and the log must hold no error lines;
- overload: ``overload_factor`` x capacity requests at once: every refusal is 429 (with
  Retry-After) or RESOURCE_EXHAUSTED, fast; every admitted request completes;
- drain: SIGTERM under load: each stream completes with all its audio or is cancelled with a clear
  message at ``drain_timeout_s`` (none is lost); the server exits 0;
- fuzz: hypothesis-drawn REST bodies and headers, WebSocket sequences and gRPC messages
  (:mod:`lyre.benchmarks.fuzz`): only successes and clear client errors; health stays 200.

Every phase runs against one server the benchmark starts (``lyre serve``) from the config (the
drain, last, ends it), with every utterance exactly its ``max_tokens`` long (the stop id held back
past the longest) so complete audio has a known byte count, and
``server.max_connections_per_client=0`` (every client here is one address).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from lyre.benchmarks import fuzz
from lyre.benchmarks.clients import Outcome, Shared, one
from lyre.benchmarks.figures import percentile
from lyre.benchmarks.load import server_stats
from lyre.benchmarks.servers import ManagedServer
from lyre.config import LyreConfig
from lyre.model import orpheus
from lyre.v1 import tts_pb2, tts_pb2_grpc

PROTOCOLS = ("rest", "ws", "grpc")
# one sentence each, no clause breaks: one piece over WebSocket too, so complete audio has one length
TEXTS = ("Thanks for calling and how can I help you today?", "Your order ships tomorrow morning.",
         "Please hold while I check that for you.", "Is there anything else I can do?")
ERROR_MARKS = (" ERROR ", "Traceback", " CRITICAL ")


@dataclass
class SoakSettings:
    requests: int = 300
    concurrency: int = 8
    disconnect: float = 0.3  # share of clients that go away at a random moment
    cancel: float = 0.1  # share that cancel (WebSocket cancel, gRPC cancel; REST: go away)
    max_tokens: int = 28  # per request (min_tokens too: a known audio length)
    overload_factor: int = 10
    drain_timeout_s: float = 2.0
    fuzz_examples: int = 100
    seed: int = 0
    derandomize: bool = True


def run(config: Path | None, cfg: LyreConfig, overrides: tuple[str, ...], s: SoakSettings, progress) -> dict[str, Any]:
    # Every stream is exactly its max_tokens long: the stop id is held back past the longest length
    # asked for (gRPC and WebSocket requests cannot carry min_tokens, so the server's default must).
    server = (*overrides, f"sampling.max_tokens={s.max_tokens}", f"sampling.min_tokens={LONG_TOKENS}",
              "server.max_connections_per_client=0", f"server.drain_timeout_s={s.drain_timeout_s}")
    capacity = cfg.scheduler.max_concurrent_sessions + cfg.scheduler.max_pending
    expected = s.max_tokens // orpheus.FRAME_TOKENS * orpheus.SAMPLES_PER_FRAME * 2  # pcm bytes
    result: dict[str, Any] = {"settings": asdict(s), "capacity": capacity}
    # One server for every phase: the drain (SIGTERM) ends it, after all the rest has been through it.
    with ManagedServer(config, server) as srv:
        progress(f"soak: {s.requests} requests at concurrency {s.concurrency}")
        result["soak"] = _soak(srv, s, expected, progress)
        progress(f"overload: {s.overload_factor * capacity} requests at once")
        result["overload"] = _overload(srv, s.overload_factor * capacity, BURST_FACTOR * s.max_tokens)
        progress(f"fuzz: {s.fuzz_examples} examples per surface")
        result["fuzz"] = fuzz.run(srv.http, srv.grpc, s.fuzz_examples, s.derandomize)
        result["fuzz"]["after"] = _settle(srv.http)
        result["fuzz"]["health"] = _status(srv.http + "/health")
        before_drain = _log(srv.log_path)
        result["log_errors"] = _errors(before_drain)
        progress("drain: SIGTERM under load")
        result["drain"] = _drain(srv, s, expected)
        result["drain"]["log_errors"] = _errors(_log(srv.log_path)[len(before_drain):])
    return result


# --------------------------------------------------------------------------------------------
# phases


def _soak(srv: ManagedServer, s: SoakSettings, expected: int, progress) -> dict[str, Any]:
    rng = random.Random(s.seed)
    plan = []
    for i in range(s.requests):
        r = rng.random()
        behaviour = "disconnect" if r < s.disconnect else "cancel" if r < s.disconnect + s.cancel else "complete"
        protocol = PROTOCOLS[i % 3]
        at = rng.choice([-1, 0, 1, 2, 3] if protocol == "ws" and behaviour == "disconnect" else [0, 1, 2, 3])
        plan.append((protocol, rng.choice(TEXTS), behaviour, at))
    warm = max(s.concurrency, len(plan) // 10)
    outcomes = _run_plan(srv, plan[:warm], s.concurrency, expected)
    rss_warm = _rss_mb(srv.pid)
    outcomes += _run_plan(srv, plan[warm:], s.concurrency, expected, progress)
    rss_end = _rss_mb(srv.pid)
    after = _settle(srv.http)
    complete = [o for o in outcomes if o.behaviour == "complete"]
    unexpected = [o for o in outcomes if o.result in ("error", "refused", "short") and o.behaviour == "complete"
                  or o.result == "error"]
    return {
        "requests": len(outcomes),
        "by_protocol": {p: sum(o.protocol == p for o in outcomes) for p in PROTOCOLS},
        "complete_with_all_audio": sum(o.result == "complete" for o in complete),
        "asked_complete": len(complete),
        "disconnected": sum(o.result == "disconnected" for o in outcomes),
        "cancelled": sum(o.result == "cancelled" for o in outcomes),
        "unexpected": len(unexpected),
        "unexpected_examples": [asdict(o) for o in unexpected[:5]],
        "rss_mb_after_warmup": rss_warm, "rss_mb_end": rss_end,
        "rss_growth_pct": None if not (rss_warm and rss_end) else 100 * (rss_end - rss_warm) / rss_warm,
        "after": after,
    }


def _overload(srv: ManagedServer, burst: int, tokens: int) -> dict[str, Any]:
    """``burst`` requests of ``tokens`` at once (REST and gRPC); then, while the admitted ones still
    stream, the refusal latency of single requests (one keep-alive connection / channel each) is
    measured."""
    expected = tokens // orpheus.FRAME_TOKENS * orpheus.SAMPLES_PER_FRAME * 2
    options = {"max_tokens": tokens, "min_tokens": tokens}

    async def go():
        shared = await Shared.open(srv.grpc)  # one connection pool: the burst costs the client little
        try:
            tasks = [asyncio.create_task(one(("rest", "grpc")[i % 2], srv.http, srv.grpc, TEXTS[i % len(TEXTS)],
                                             "complete", 0, expected, options, shared)) for i in range(burst)]
            while not any(t.done() for t in tasks):  # the refusals come back first
                await asyncio.sleep(0.01)
            probes = await _refusal_probes(srv, PROBES)
            return await asyncio.gather(*tasks), probes
        finally:
            await shared.close()

    outcomes, probes = asyncio.run(go())
    refused = [o for o in outcomes if o.result == "refused"]
    admitted = [o for o in outcomes if o.result != "refused"]
    clear = [o for o in refused + probes if (o.protocol == "rest" and o.status == "429" and o.retry_after)
             or (o.protocol == "grpc" and o.status == "RESOURCE_EXHAUSTED")]
    latencies = [o.latency_ms for o in probes if o.result == "refused"]
    return {
        "burst": burst, "admitted": len(admitted), "refused": len(refused),
        "admitted_complete": sum(o.result == "complete" for o in admitted),
        "admitted_incomplete_examples": [asdict(o) for o in admitted if o.result != "complete"][:5],
        "probes": len(probes), "probes_refused": len(latencies),
        "refused_clearly": len(clear), "refusals": len(refused) + len(latencies),  # 429+Retry-After / RESOURCE_EXHAUSTED
        "burst_answer_ms_p99": percentile([o.latency_ms for o in refused], 0.99),
        "rejection_ms_p50": percentile(latencies, 0.5), "rejection_ms_p99": percentile(latencies, 0.99),
        "rejection_ms_max": max(latencies, default=None),
        "after": _settle(srv.http),
    }


BURST_FACTOR = 10  # x max_tokens per admitted request (280 = 3.4 s of audio at the default 28): the server
# stays full while refusals are timed
PROBES = 100  # per protocol: a p99 over 200 refusals


async def _refusal_probes(srv: ManagedServer, n: int) -> list[Outcome]:
    """``n`` requests one after another on one REST connection and ``n`` on one gRPC channel, each
    connection opened by an untimed request first (what is timed is the refusal, not a TCP accept
    behind the burst)."""
    out = []
    async with aiohttp.ClientSession() as s:
        async with s.get(srv.http + "/health") as r:  # (opens the kept-alive connection)
            await r.read()
        for _ in range(n):
            start = time.perf_counter()
            async with s.post(srv.http + "/v1/audio/speech", json={"input": "hi", "response_format": "pcm"}) as r:
                await r.read()
                ms = 1000 * (time.perf_counter() - start)
                out.append(Outcome("rest", "probe", "refused" if r.status == 429 else "admitted", status=str(r.status),
                                   retry_after=r.headers.get("Retry-After"), latency_ms=ms))
    async with grpc.aio.insecure_channel(srv.grpc) as channel:
        await channel.channel_ready()  # (connected before the first timed call)
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        for _ in range(n):
            start = time.perf_counter()
            try:
                await stub.Synthesize(tts_pb2.SynthesizeRequest(text="hi"))
                out.append(Outcome("grpc", "probe", "admitted", latency_ms=1000 * (time.perf_counter() - start)))
            except grpc.aio.AioRpcError as e:
                refused = e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                out.append(Outcome("grpc", "probe", "refused" if refused else "error", status=e.code().name,
                                   latency_ms=1000 * (time.perf_counter() - start)))
    return out


def _drain(srv: ManagedServer, s: SoakSettings, expected: int) -> dict[str, Any]:
    """SIGTERM to ``srv`` while half the streams are short (``max_tokens``: they should finish inside
    ``drain_timeout_s``) and half far too long to. Every stream must end complete with all its audio,
    or cancelled with a clear message no earlier than ``drain_timeout_s`` after the signal (the
    server's clock starts after ours, so an earlier one is a stream cut short); the server exits 0.

    Whether a short stream finishes inside the timeout is a matter of the machine's speed, not of
    Lyre's drain: on 2 CPU cores the demo's 28-token streams at concurrency 8 end 0.3-1.5 s after
    the signal on a warm server (1.5-2.5 s on a fresh one), and with every core busy up to ~6.5 s
    (the codec decodes first chunks a few per round). So a short stream cancelled with the message at
    the timeout is counted apart (``short_cut_at_timeout``: a machine too slow for this
    ``drain_timeout_s``), as is a long one that completes (``long_completed``: one too fast for
    ``LONG_TOKENS``). ``lost`` is every stream that ended any other way: that would be Lyre's fault."""
    n = max(2, min(s.concurrency, 8))
    plan = [(PROTOCOLS[i % 3], TEXTS[i % len(TEXTS)], i % 2 == 1) for i in range(n)]

    async def go():
        before = server_stats(srv.http)["scheduler"]["total_sessions"]

        async def timed(p, text, long):
            outcome = await one(p, srv.http, srv.grpc, text, "complete", 0, expected, _drain_options(long, s))
            return outcome, time.monotonic()

        tasks = [asyncio.create_task(timed(p, text, long)) for p, text, long in plan]
        # everyone is in (or something ended already: then its outcome says what)
        while server_stats(srv.http)["scheduler"]["total_sessions"] < before + n and not any(t.done() for t in tasks):
            await asyncio.sleep(0.05)
        start = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        ended = await asyncio.gather(*tasks)
        code = await asyncio.to_thread(srv.proc.wait, 120)
        return [(o, at - start) for o, at in ended], code, time.monotonic() - start

    ended, code, took = asyncio.run(go())

    def told(o: Outcome, after_s: float) -> bool:  # cancelled with a clear message, at the timeout
        clear = "drain_timeout_s" in o.message or o.status in ("CANCELLED", "UNAVAILABLE")
        return o.result in ("error", "short") and clear and after_s >= s.drain_timeout_s

    short = [(o, t) for (o, t), (_, _, long) in zip(ended, plan, strict=True) if not long]
    long_ = [(o, t) for (o, t), (_, _, long) in zip(ended, plan, strict=True) if long]
    lost = [(o, t) for o, t in ended if o.result != "complete" and not told(o, t)]
    return {"streams": n, "drain_timeout_s": s.drain_timeout_s,
            "finishing_in_time": len(short), "completed_with_all_audio": sum(o.result == "complete" for o, _ in short),
            "short_cut_at_timeout": sum(told(o, t) for o, t in short),
            "too_long": len(long_), "cancelled_with_a_message": sum(told(o, t) for o, t in long_),
            "long_completed": sum(o.result == "complete" for o, _ in long_),
            "lost": len(lost), "lost_examples": [{**asdict(o), "ended_after_s": round(t, 3)} for o, t in lost[:5]],
            "exit_code": code, "exit_s": took,
            "outcomes": [{**asdict(o), "ended_after_s": round(t, 3)} for o, t in ended]}


LONG_TOKENS = 3000  # ~36 s of audio: longer than the drain timeout even where generation is fast


def _drain_options(long: bool, s: SoakSettings) -> dict[str, Any]:
    tokens = LONG_TOKENS if long else s.max_tokens
    return {"max_tokens": tokens, "min_tokens": tokens, "stream_format": "sse"}


# --------------------------------------------------------------------------------------------
# helpers


def _run_plan(srv: ManagedServer, plan: list[tuple], concurrency: int, expected: int, progress=None) -> list[Outcome]:
    async def go():
        gate = asyncio.Semaphore(concurrency)
        done = 0

        async def run_one(protocol, text, behaviour, at):
            nonlocal done
            async with gate:
                outcome = await one(protocol, srv.http, srv.grpc, text, behaviour, at, expected)
            done += 1
            if progress and done % max(1, len(plan) // 10) == 0:
                progress(f"  {done}/{len(plan)}")
            return outcome

        return await asyncio.gather(*(run_one(*p) for p in plan))

    return asyncio.run(go())


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _settle(http: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """What is left once the server has seen every disconnect: KV slots, sessions, codec states."""
    start = time.monotonic()
    while True:
        stats = server_stats(http)
        left = {"kv_slots_used": stats["kv_cache"]["used_slots"],
                "active_sessions": stats["scheduler"]["active_sessions"],
                "pending_sessions": stats["scheduler"]["pending_sessions"],
                "codec_states": stats.get("codec", {}).get("open_states", 0)}
        if not any(left.values()) or time.monotonic() - start > timeout_s:
            return {**left, "settled_s": round(time.monotonic() - start, 2)}
        time.sleep(0.05)


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _log(log_path: str) -> list[str]:
    """The server's log so far, as lines."""
    return Path(log_path).read_text().splitlines()


def _errors(lines: list[str]) -> list[str]:
    return [line for line in lines if any(m in line for m in ERROR_MARKS)]


# --------------------------------------------------------------------------------------------
# report


def table(r: dict[str, Any]) -> str:
    s, o, d, f = r["soak"], r["overload"], r["drain"], r["fuzz"]
    st = r["settings"]
    left = lambda a: ", ".join(f"{k} {v}" for k, v in a.items())  # noqa: E731
    p99 = o["rejection_ms_p99"]
    growth = s["rss_growth_pct"]
    lines = [
        f"soak      {s['requests']} requests (REST/WebSocket/gRPC {'/'.join(str(v) for v in s['by_protocol'].values())}), "
        f"concurrency {st['concurrency']}, {st['disconnect']:.0%} disconnect, {st['cancel']:.0%} cancel",
        f"          complete with all audio {s['complete_with_all_audio']}/{s['asked_complete']}; disconnected "
        f"{s['disconnected']}, cancelled {s['cancelled']}; unexpected outcomes {s['unexpected']}",
        f"          afterwards: {left(s['after'])}",
        f"          server RSS {s['rss_mb_after_warmup'] or 0:.0f} MB after warm-up -> {s['rss_mb_end'] or 0:.0f} MB "
        f"({'n/a' if growth is None else f'{growth:+.1f}%'}; goal < 5%)",
        f"overload  {o['burst']} at once ({st['overload_factor']}x capacity {r['capacity']}): admitted {o['admitted']} "
        f"({o['admitted_complete']} complete), refused {o['refused']}; then {o['probes']} single requests while full: "
        f"{o['probes_refused']} refused; {o['refused_clearly']}/{o['refusals']} refusals 429+Retry-After or "
        f"RESOURCE_EXHAUSTED; rejection p50 {o['rejection_ms_p50'] or 0:.1f} ms, p99 {p99 or 0:.1f} ms (goal < 10 ms), "
        f"max {o.get('rejection_ms_max') or 0:.1f} ms",
        f"drain     {d['streams']} streams, SIGTERM, drain_timeout_s {d['drain_timeout_s']:g}: "
        f"{d['completed_with_all_audio']}/{d['finishing_in_time']} short ones finished with all audio "
        f"({d['short_cut_at_timeout']} cut at the timeout: a slow machine), "
        f"{d['cancelled_with_a_message']}/{d['too_long']} long ones cancelled with a message at the timeout; "
        f"{d['lost']} lost; exit {d['exit_code']} after {d['exit_s']:.1f} s",
        f"fuzz      {f['rest']} REST bodies, {f['ws_sequences']} WebSocket sequences, {f['grpc']} gRPC messages, "
        f"{f['grpc_streams']} gRPC/Riva streams ({f['corpus']} from the fixed corpus): "
        f"{len(f['violations'])} violations; health {f['health']}; afterwards {left(f['after'])}",
        f"log       {len(r['log_errors']) + len(d['log_errors'])} error lines",
    ]
    return "\n".join(lines)
