"""``benchmark.py --mode scaling | all | tuning``: load against servers, tables, JSON and plots.

- scaling: closed-loop users at each concurrency level (``--levels`` or 1, 2, 4, ... up to
  ``--concurrent``); ``--find-max`` bisects for the largest concurrency meeting ``--slo``.
- all: one user, then ``--concurrent`` users, then Poisson arrivals at ``--rps``, then the sweep.
- tuning: a grid over scheduler settings (policy, max_batch_size, flush sizes) for each tuning
  profile, restarting the server it owns for every point, and the best setting per profile.

Each "engine" is a server: Lyre (one per ``--policies`` x ``--codec-modes`` entry when the benchmark
owns it) and, with ``--baseline transformers``, the peer serving the same checkpoint the simplest way.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import platform
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lyre.benchmarks import voices as bench_voices
from lyre.benchmarks.figures import find_max, parse_slo
from lyre.benchmarks.load import Target, load_texts, run_level
from lyre.benchmarks.servers import ManagedServer


def default_levels(top: int) -> list[int]:
    levels, n = [], 1
    while n < top:
        levels.append(n)
        n *= 2
    return levels + [top]


@contextlib.contextmanager
def server_for(args, overrides: tuple[str, ...] = (), baseline: str | None = None) -> Iterator[tuple[str, str]]:
    """The (http, grpc) addresses to load: ``--url`` as given, or a server we start and stop."""
    if args.url and not baseline:
        yield args.url.rstrip("/"), args.grpc_url
        return
    with ManagedServer(args.config, tuple(args.overrides) + overrides, baseline) as srv:
        yield srv.http, srv.grpc


def _target(args, http: str, grpc: str, voice: str | None = None) -> Target:
    extra = {"max_tokens": args.max_tokens} if args.max_tokens else {}
    if getattr(args, "speed", None) is not None:
        if args.protocol != "rest":
            raise SystemExit("--speed is for --protocol rest (speed is OpenAI's REST parameter)")
        extra["speed"] = args.speed
    replicas = [u.strip().rstrip("/") for u in (args.replica_urls or "").split(",") if u.strip()]
    return Target(args.protocol, http, grpc, voice, extra, args.api_key, args.format, replicas)


def _engines(args) -> list[tuple[str, tuple[str, ...], str | None]]:
    """(name, server overrides, baseline) for each server to measure: one per policy x codec mode x
    prefix cache setting."""
    policies = [p for p in (args.policies or "").split(",") if p] if not args.url else []
    modes = [m for m in (args.codec_modes or "").split(",") if m] if not args.url else []
    caches = [c for c in (args.prefix_cache or "").split(",") if c] if not args.url else []
    engines = []
    for policy, mode, cache in itertools.product(policies or [None], modes or [None], caches or [None]):
        name = "-".join(["lyre"] + [x for x in (policy, mode, cache and f"cache-{cache}") if x])
        overrides = tuple(o for o, x in ((f"scheduler.policy={policy}", policy), (f"codec.mode={mode}", mode),
                                         ("voices.prefix_cache_mb=0", cache == "off")) if x)
        engines.append((name, overrides, None))
    if args.baseline:
        engines.append((args.baseline, (), args.baseline))
    return engines


def _levels_requests(args, c: int) -> int:
    return args.requests if args.requests else max(4, 2 * c)


def sweep(args, texts: list[str], say) -> dict[str, Any]:
    levels = args.levels or default_levels(args.concurrent)
    out: dict[str, Any] = {}
    for name, overrides, baseline in _engines(args):
        with server_for(args, overrides, baseline) as (http, grpc):
            chosen = [(None, args.voice)] if baseline else bench_voices.voices(args, http)
            for label, voice in chosen:
                key = name if len(chosen) == 1 else f"{name}/{label}"
                target = _target(args, http, grpc, voice)
                measure = lambda c, key=key, target=target: run_level(  # noqa: E731
                    target, "closed", c, _levels_requests(args, c), texts, f"{key}: {c} users")
                entry: dict[str, Any] = {"levels": [], "voice": voice}
                say(f"{key}: one request to warm the server up (not counted)")
                run_level(target, "closed", 1, 1, texts, f"{key}: warm-up")
                for c in levels:
                    say(f"{key}: {c} concurrent users")
                    entry["levels"].append(measure(c))
                if args.find_max:
                    slo = parse_slo(args.slo)
                    best, tried = find_max(measure, slo, max(levels),  # (the sweep's levels are not measured again)
                                           known={lv["concurrency"]: lv for lv in entry["levels"]})
                    entry["find_max"] = {"slo": slo, "max_concurrency": best, "tried": tried}
                    say(f"{key}: largest concurrency meeting the SLO: {best}")
                out[key] = entry
    return out


def ratios(engines: dict[str, Any], baseline: str) -> dict[str, Any]:
    """Per level and figure: each Lyre engine's value divided by the baseline's."""
    base = {lv["concurrency"]: lv for lv in engines[baseline]["levels"]}
    out: dict[str, Any] = {}
    for name, entry in engines.items():
        if name == baseline:
            continue
        rows = []
        for lv in entry["levels"]:
            b = base.get(lv["concurrency"])
            if b is None:
                continue
            row = {"concurrency": lv["concurrency"]}
            for key in ("audio_s_per_wall_s", "server_tokens_per_s", "ttfb_ms_p50", "ttfb_ms_p95", "real_time_streams"):
                if lv.get(key) is not None and b.get(key):
                    row[key] = lv[key] / b[key]
            rows.append(row)
        out[name] = rows
    return out


def _check_slo(args) -> None:
    """A malformed --slo is refused before any server starts or any level is measured."""
    if args.find_max:
        parse_slo(args.slo)


def run_scaling(args, say) -> dict[str, Any]:
    _check_slo(args)
    texts = load_texts(args.texts or "conversational")
    engines = sweep(args, texts, say)
    result = {"mode": "scaling", "engines": engines}
    if args.baseline:
        result["ratios_vs_" + args.baseline] = ratios(engines, args.baseline)
    return result


def run_all(args, say) -> dict[str, Any]:
    _check_slo(args)
    texts = load_texts(args.texts or "conversational")
    result: dict[str, Any] = {"mode": "all"}
    with server_for(args) as (http, grpc):
        target = _target(args, http, grpc, bench_voices.voices(args, http)[0][1])
        say("single user")
        result["single"] = run_level(target, "closed", 1, min(args.requests or 5, 5), texts, "1 user")
        say(f"{args.concurrent} concurrent users, {args.requests or 2 * args.concurrent} requests")
        result["closed_loop"] = run_level(target, "closed", args.concurrent, args.requests or 2 * args.concurrent,
                                          texts, f"{args.concurrent} users")
        say(f"Poisson arrivals at {args.rps} requests/s")
        result["open_loop"] = run_level(target, "open", args.rps, args.requests or 2 * args.concurrent, texts,
                                        f"{args.rps} rps")
    result["engines"] = sweep(args, texts, say)
    if args.baseline:
        result["ratios_vs_" + args.baseline] = ratios(result["engines"], args.baseline)
    return result


def run_tuning(args, cfg, say) -> dict[str, Any]:
    if args.url:
        raise ValueError("--mode tuning restarts the server for every setting: it needs a server it owns (no --url)")
    grid = list(itertools.product(args.grid_policies.split(","), [int(b) for b in args.grid_batch.split(",")],
                                  [tuple(int(x) for x in f.split(":")) for f in args.grid_flush.split(",")]))
    result: dict[str, Any] = {"mode": "tuning", "profiles": {}}
    for profile, tuning in cfg.tuning.items():
        texts = load_texts(args.texts or (profile if profile in ("conversational", "longform") else "conversational"))
        users = tuning.target_concurrent
        points = []
        for policy, batch, (first, every) in grid:
            overrides = (f"profile={profile}", f"scheduler.policy={policy}", f"scheduler.max_batch_size={batch}",
                         f"scheduler.flush_first_n_tokens={first}", f"scheduler.flush_every_n_tokens={every}",
                         f"scheduler.max_concurrent_sessions={max(users, batch, cfg.scheduler.max_concurrent_sessions)}")
            say(f"{profile}: policy={policy} max_batch_size={batch} flush={first}/{every} at {users} users")
            with ManagedServer(args.config, tuple(args.overrides) + overrides) as srv:
                voice = bench_voices.voices(args, srv.http)[0][1]
                summary = run_level(_target(args, srv.http, srv.grpc, voice), "closed", users,
                                    args.requests or 2 * users, texts, f"{profile} {policy}/{batch}/{first}:{every}")
            summary["settings"] = {"policy": policy, "max_batch_size": batch, "flush_first_n_tokens": first,
                                   "flush_every_n_tokens": every}
            summary["meets_target"] = (summary["success_rate"] == 1.0 and summary["ttfb_ms_p95"] is not None
                                       and summary["ttfb_ms_p95"] <= tuning.target_ttfb_ms)
            points.append(summary)
        best = max(points, key=lambda p: (p["meets_target"], p["streams_without_underrun"] or 0.0,
                                          -(p["ttfb_ms_p95"] or float("inf"))))
        result["profiles"][profile] = {"target_concurrent": users, "target_ttfb_ms": tuning.target_ttfb_ms,
                                       "points": points, "best": best["settings"],
                                       "best_meets_target": best["meets_target"]}
    return result


# --------------------------------------------------------------------------------------------
# presentation


def machine() -> dict[str, Any]:
    import torch

    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def _fmt(v: Any, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def level_table(engines: dict[str, Any]) -> str:
    head = (f"{'engine':<22}{'users':>6}{'success':>9}{'TTFB p50':>10}{'p95':>8}{'p99':>8}{'real-time':>11}"
            f"{'underruns':>10}{'audio s/s':>10}{'tok/s':>8}{'dec/emit':>9}{'codec ms/frame':>15}{'prompt/prefilled':>18}")
    lines = [head]
    for name, entry in engines.items():
        for lv in entry["levels"]:
            lines.append(f"{name:<22}{lv['concurrency']:>6}{lv['success_rate']:>9.0%}{_fmt(lv['ttfb_ms_p50']):>10}"
                         f"{_fmt(lv['ttfb_ms_p95']):>8}{_fmt(lv['ttfb_ms_p99']):>8}"
                         f"{_fmt(lv['real_time_streams'], 'd'):>6}/{len(lv['per_request']):<4}{_fmt(lv['underruns'], 'd'):>10}"
                         f"{lv['audio_s_per_wall_s']:>10.2f}{_fmt(lv['server_tokens_per_s']):>8}"
                         f"{_fmt(lv.get('decoded_per_emitted'), '.2f'):>9}{_fmt(lv.get('codec_ms_per_frame'), '.1f'):>15}"
                         f"{_fmt(lv.get('prompt_tokens_per_request')) + '/' + _fmt(lv.get('prefilled_tokens_per_request')):>18}")
        for lv in entry["levels"]:
            if lv.get("replicas"):
                spread = ", ".join(f"{r['url']}: {r.get('sessions', '-')} sessions, {_fmt(r.get('tokens_per_s'))} tok/s"
                                   for r in lv["replicas"])
                lines.append(f"  {name} at {lv['concurrency']} users, per replica: {spread}")
        if "find_max" in entry:
            fm = entry["find_max"]
            lines.append(f"{name}: largest concurrency meeting {fm['slo']}: {fm['max_concurrency']}")
    return "\n".join(lines)


COST_PARTS = ("model", "sampling", "codec", "encoding", "rest", "total")


def cost_table(engines: dict[str, Any]) -> str:
    """CPU seconds the server spent per second of audio it delivered, by part, per engine and level."""
    rows = [(name, lv) for name, entry in engines.items() for lv in entry["levels"] if lv.get("cpu_s_per_audio_s")]
    if not rows:
        return ""
    lines = ["server CPU s per audio s:  " + "".join(f"{p:>10}" for p in COST_PARTS)]
    for name, lv in rows:
        cost = lv["cpu_s_per_audio_s"]
        lines.append(f"{name:<18}{lv['concurrency']:>3} users" + "".join(f"{cost.get(p, 0.0):>10.3f}" for p in COST_PARTS))
    return "\n".join(lines)


def summary_text(result: dict[str, Any]) -> str:
    parts = []
    if result["mode"] == "all":
        for key in ("single", "closed_loop", "open_loop"):
            r = result[key]
            parts.append(f"{key:<12} requests={r['requests']} success={r['success_rate']:.0%} "
                         f"TTFB p50/p95/p99={_fmt(r['ttfb_ms_p50'])}/{_fmt(r['ttfb_ms_p95'])}/{_fmt(r['ttfb_ms_p99'])} ms "
                         f"real-time={_fmt(r['real_time_streams'], 'd')}/{r['requests']} audio s/s={r['audio_s_per_wall_s']:.2f}")
    if result["mode"] in ("scaling", "all"):
        parts.append(level_table(result["engines"]))
        if costs := cost_table(result["engines"]):
            parts.append(costs)
        for key, rows in result.items():
            if key.startswith("ratios_vs_"):
                for name, rs in rows.items():
                    for row in rs:
                        figures = ", ".join(f"{k} {v:.2f}x" for k, v in row.items() if k != "concurrency")
                        parts.append(f"{name} / {key[10:]} at {row['concurrency']} users: {figures}")
    if result["mode"] == "tuning":
        for profile, p in result["profiles"].items():
            parts.append(f"{profile} (target {p['target_concurrent']} users, TTFB p95 <= {p['target_ttfb_ms']:.0f} ms):")
            for pt in p["points"]:
                s = pt["settings"]
                parts.append(f"  {s['policy']:<9} batch {s['max_batch_size']:<4} flush {s['flush_first_n_tokens']}/"
                             f"{s['flush_every_n_tokens']:<4} TTFB p95 {_fmt(pt['ttfb_ms_p95']):>6} ms  real-time "
                             f"{_fmt(pt['real_time_streams'], 'd')}/{pt['requests']}  {'meets' if pt['meets_target'] else 'misses'}")
            parts.append(f"  best: {p['best']}{'' if p['best_meets_target'] else ' (no setting met the target)'}")
    return "\n".join(parts)


def plot(result: dict[str, Any], path: Path) -> None:
    """TTFB p50/p95 and real-time streams against concurrency, one line per engine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, entry in result["engines"].items():
        xs = [lv["concurrency"] for lv in entry["levels"]]
        line, = ax1.plot(xs, [lv["ttfb_ms_p50"] for lv in entry["levels"]], marker="o", label=f"{name} p50")
        ax1.plot(xs, [lv["ttfb_ms_p95"] for lv in entry["levels"]], marker="x", linestyle="--",
                 color=line.get_color(), label=f"{name} p95")
        # of the N concurrent streams, how many stay ahead of their listener
        ax2.plot(xs, [lv["streams_without_underrun"] * lv["concurrency"] for lv in entry["levels"]], marker="o",
                 label=name)
    top = max(lv["concurrency"] for e in result["engines"].values() for lv in e["levels"])
    ax2.plot([1, top], [1, top], color="grey", linestyle=":", label="every stream")
    ax1.set(xlabel="concurrent users", ylabel="TTFB (ms)", title="Time to first audio")
    ttfbs = [lv[k] for e in result["engines"].values() for lv in e["levels"] for k in ("ttfb_ms_p50", "ttfb_ms_p95")
             if lv[k]]
    if ttfbs and max(ttfbs) > 20 * min(ttfbs):
        ax1.set_yscale("log")  # a slow peer would flatten everyone else
    ax2.set(xlabel="concurrent users", ylabel="real-time streams", title="Streams with no underrun")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
