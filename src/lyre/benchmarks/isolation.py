"""``benchmark.py --mode isolation``: can one tenant take the server from another? (issue 24)

On a server it starts with two accounts (``server.api_keys``: a victim and an attacker) and a
descriptor limit an attack can reach (``RLIMIT_NOFILE`` = ``nofile``, soft and hard, set in the
server's process before it starts), the victim (:mod:`lyre.benchmarks.victim`) is measured quiet,
then under each attack in turn (:mod:`lyre.benchmarks.attacks`), each run by a process the
benchmark starts and stops by its pid: a half-open connection flood up to the descriptor limit,
one account filling its sessions and WebSocket contexts with long utterances, stalled verify
uploads, an enrollment flood, oversized audio.

Per phase: the victim's success (syntheses, verifications, enrollments), TTFB p50/p95 and p95 over
quiet, ``/health``'s slowest answer; the server's peak RSS (sampled VmRSS, and VmHWM where it rose)
and open descriptors, sampled from /proc all through the phase; its log's growth; and, after the
attack stopped, whether RSS, descriptors and the sessions ``/v1/stats`` shows each account came back
to their idle level and the server takes an upload again (polled, up to ``settle_timeout_s``). The
goals (issue 24): victim success 100%, TTFB p95 <= 2x quiet, peak RSS <= 1.5x idle, ``/health``
within 100 ms, and back to idle after.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lyre.benchmarks import victim as victim_bench
from lyre.benchmarks.attacks import KEY_ENV
from lyre.benchmarks.load import server_stats
from lyre.benchmarks.servers import ManagedServer, free_port
from lyre.benchmarks.victim import VictimSettings

ATTACKS = ("half_open", "account_flood", "stalled_verify", "enrollment_flood", "oversized_audio")
LABELS = {"quiet": "quiet", "half_open": "half-open flood", "account_flood": "account flood",
          "stalled_verify": "stalled verify", "enrollment_flood": "enrollment flood",
          "oversized_audio": "oversized audio"}
GOALS = {"success_rate": 1.0, "ttfb_p95_x_quiet": 2.0, "peak_rss_x_idle": 1.5, "health_max_ms": 100.0}
FD_SLACK = 8  # descriptors over idle still counted as idle
RSS_SLACK = 0.10  # share of idle RSS over it still counted as idle
KEEP_LOG_BYTES = 20 * 2**20  # the server's log is kept (its path in the result) up to this size


def attack_sizes(nofile: int, quick: bool) -> dict[str, dict[str, Any]]:
    """Each attack's settings (:mod:`lyre.benchmarks.attacks`): small, so a run takes minutes on 2 cores."""
    if quick:
        return {"half_open": {"connections": nofile + 64},
                "account_flood": {"sockets": 2, "contexts": 2, "rest_streams": 2, "max_tokens": 700},
                "stalled_verify": {"uploads": 3, "declared_bytes": 2_000_000, "sent_bytes": 16384},
                "enrollment_flood": {"enrollers": 2, "clip_seconds": 4.0},
                "oversized_audio": {"uploaders": 1, "seconds": 4.0}}
    return {"half_open": {"connections": nofile + 256},
            "account_flood": {"sockets": 4, "contexts": 8, "rest_streams": 8, "max_tokens": 2000},
            "stalled_verify": {"uploads": 8, "declared_bytes": 5_000_000, "sent_bytes": 65536},
            "enrollment_flood": {"enrollers": 4, "clip_seconds": 20.0},
            "oversized_audio": {"uploaders": 2, "seconds": 60.0}}


@dataclass
class IsolationSettings:
    victim: VictimSettings = field(default_factory=VictimSettings)
    attacks: tuple[str, ...] = ATTACKS
    nofile: int = 1024  # the server's RLIMIT_NOFILE, soft and hard
    sizes: dict[str, dict[str, Any]] = field(default_factory=lambda: attack_sizes(1024, False))
    ready_timeout_s: float = 60.0  # for an attack to be in place (then the victim starts anyway)
    settle_timeout_s: float = 60.0  # for the server to come back to idle after an attack


def quick(s: IsolationSettings) -> IsolationSettings:
    """The small run of the test suite."""
    v = s.victim
    return IsolationSettings(
        victim=VictimSettings(requests=min(v.requests, 3), min_s=min(v.min_s, 2.0), concurrency=v.concurrency,
                              max_tokens=min(v.max_tokens, 14), request_timeout_s=8.0, deadline_s=10.0,
                              verify_probes=1, enroll_probes=1),
        attacks=s.attacks, nofile=min(s.nofile, 256), sizes=attack_sizes(min(s.nofile, 256), True),
        ready_timeout_s=20.0, settle_timeout_s=5.0)  # (back-to-idle is reported, not waited for long)


def run(config: Path | None, overrides: tuple[str, ...], s: IsolationSettings, progress) -> dict[str, Any]:
    from lyre.benchmarks.scaling import machine

    keys = {"victim": f"victim-{secrets.token_hex(8)}", "attacker": f"attacker-{secrets.token_hex(8)}"}
    api_keys = json.dumps({key: account for account, key in keys.items()})  # (JSON is a YAML flow mapping)
    result: dict[str, Any] = {"mode": "isolation", "settings": asdict(s), "goals": GOALS, "machine": machine()}
    with tempfile.TemporaryDirectory(prefix="lyre-isolation-") as data_dir:
        server = LimitedServer(config, (f"data_dir={data_dir}", *overrides, f"server.api_keys={api_keys}"),
                               nofile=s.nofile)
        try:
            with server as srv:
                progress(f"isolation: server pid {srv.pid}, RLIMIT_NOFILE {srv.nofile}; warming up")
                result["nofile"] = srv.nofile
                result["idle"] = _idle(srv, keys, s)
                result["phases"] = []
                for name in ("quiet", *s.attacks):
                    progress(f"isolation: {LABELS[name]}")
                    result["phases"].append(_phase(name, srv, keys, s, result["idle"]))
            result["server_exit"] = server.proc.returncode
        finally:
            log = getattr(server, "_log", None)
            if log is not None:  # kept where it is small; a flood can make it hundreds of MB
                result["server_log_bytes"] = size = os.path.getsize(log.name)
                result["server_log"] = log.name if size <= KEEP_LOG_BYTES else None
                if size > KEEP_LOG_BYTES:
                    os.unlink(log.name)
    quiet = result["phases"][0]
    for phase in result["phases"]:
        phase["verdict"] = verdict(phase, quiet, result["idle"])
    return result


# --------------------------------------------------------------------------------------------
# phases


def _idle(srv: ManagedServer, keys: dict[str, str], s: IsolationSettings) -> dict[str, Any]:
    """The server's idle level, after a warm-up of each thing the victim does."""
    warm = VictimSettings(requests=2, min_s=0.0, concurrency=1, max_tokens=s.victim.max_tokens, verify_probes=1,
                          enroll_probes=min(1, s.victim.enroll_probes), deadline_s=120.0, request_timeout_s=60.0)
    warmup = victim_bench.run(srv.http, keys["victim"], warm)
    settled = _settle(srv, keys, None, s.settle_timeout_s)
    samples = []
    for _ in range(10):
        if (now := proc_figures(srv.pid)) is None:
            raise RuntimeError(f"the benchmark's server exited ({srv.proc.poll()}) during its warm-up")
        samples.append(now)
        time.sleep(0.1)
    return {"rss_mb": max(x["rss_mb"] for x in samples), "fds": max(x["fds"] for x in samples),
            "sessions": settled["sessions"], "warmup_ok": warmup["ok"], "warmup_calls": warmup["calls"]}


def _phase(name: str, srv: ManagedServer, keys: dict[str, str], s: IsolationSettings, idle: dict) -> dict[str, Any]:
    result: dict[str, Any] = {"phase": name}
    if srv.proc.poll() is not None:
        result["skipped"] = f"the server exited with {srv.proc.returncode}"
        return result
    log_start = os.path.getsize(srv.log_path)
    with Sampler(srv.pid) as sampler:
        attacker = Attacker(name, s.sizes[name], srv.http, keys["attacker"]) if name != "quiet" else None
        ready = None
        try:
            ready = attacker.wait_ready(s.ready_timeout_s) if attacker else None
            start = time.monotonic()
            result["victim"] = victim_bench.run(srv.http, keys["victim"], s.victim)
            result["victim_s"] = round(time.monotonic() - start, 2)
        finally:  # whatever happened, the attack stops here
            result["attack"] = {"ready": ready, **attacker.stop()} if attacker else None
        result["peak_under_attack"] = sampler.peak()
        result["after"] = _settle(srv, keys, idle, s.settle_timeout_s)
    result["peak"] = sampler.peak()
    result["log_bytes"] = os.path.getsize(srv.log_path) - log_start
    return result


def _settle(srv: ManagedServer, keys: dict[str, str], idle: dict | None, timeout_s: float) -> dict[str, Any]:
    """Polls until the server's descriptors, RSS and every account's sessions are back to ``idle``
    and it takes an upload again (a verification: its places for uploads are free), or
    ``timeout_s``; with ``idle`` None, until no account has a session."""
    start = time.monotonic()
    while True:
        now = proc_figures(srv.pid)
        sessions = {who: _sessions(srv.http, key) for who, key in keys.items()}
        back = {"sessions": all(n == 0 for n in sessions.values())}
        if idle is not None:
            back["fds"] = now is not None and now["fds"] <= idle["fds"] + FD_SLACK
            back["rss"] = now is not None and now["rss_mb"] <= idle["rss_mb"] * (1 + RSS_SLACK)
            back["uploads"] = victim_bench.can_upload(srv.http, keys["victim"])
        if all(back.values()) or time.monotonic() - start > timeout_s:
            return {"returned": all(back.values()), "back": back, "sessions": sessions,
                    "rss_mb": now and now["rss_mb"], "fds": now and now["fds"],
                    "settled_s": round(time.monotonic() - start, 2)}
        time.sleep(0.25)


def _sessions(http: str, key: str) -> int | None:
    """Active + pending sessions as ``/v1/stats`` shows them to the account of ``key``."""
    stats = server_stats(http, key)
    scheduler = (stats or {}).get("scheduler")
    return None if not scheduler else scheduler.get("active_sessions", 0) + scheduler.get("pending_sessions", 0)


# --------------------------------------------------------------------------------------------
# processes: the server, its figures, the attackers


class LimitedServer(ManagedServer):
    """A :class:`ManagedServer` whose process starts with ``RLIMIT_NOFILE`` = ``nofile``, soft and
    hard (the hard one too: a server that raises its soft limit to the hard one at start still has
    this limit), so that "up to the descriptor limit" is reachable on this machine."""

    def __init__(self, config: Path | None, overrides: tuple[str, ...], nofile: int):
        super().__init__(config, overrides)
        self.nofile = nofile

    def __enter__(self) -> LimitedServer:
        grpc_port = free_port()
        args = [sys.executable, "-m", "lyre", "serve", "--host", "127.0.0.1", "--port", "0", "--grpc-port",
                str(grpc_port), *(["--config", str(self.config)] if self.config else []),
                *(x for o in self.overrides for x in ("--set", o))]
        self._log = tempfile.NamedTemporaryFile("w+", prefix="lyre-isolation-server-", suffix=".log", delete=False)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard != resource.RLIM_INFINITY:
            self.nofile = min(self.nofile, hard)  # (a limit can be lowered, not raised)
        limit = (self.nofile, self.nofile)
        self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                      preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit))
        self.pid = self._proc.pid
        line = self._proc.stdout.readline()  # the server prints its ready line once it listens
        if "Lyre ready" not in line:
            self._proc.kill()
            self._proc.wait()
            raise RuntimeError(f"the benchmark's server did not start:\n{Path(self._log.name).read_text()[-2000:]}")
        self.http, self.grpc = line.split()[2], f"127.0.0.1:{grpc_port}"
        return self


def proc_figures(pid: int) -> dict[str, float] | None:
    """VmRSS and VmHWM (MB) and open descriptors of process ``pid``; None once it is gone."""
    try:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None
    return {"rss_mb": int(status["VmRSS"].split()[0]) / 1024, "hwm_mb": int(status["VmHWM"].split()[0]) / 1024,
            "fds": fds}


class Sampler:
    """``with Sampler(pid) as s:`` samples the process's figures every ``every_s`` in a thread;
    ``s.peak()``: the largest so far."""

    def __init__(self, pid: int, every_s: float = 0.1):
        self.pid, self.every_s = pid, every_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="isolation-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self.first = proc_figures(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            if (now := proc_figures(self.pid)) is not None:
                self.samples.append(now)
            self._stop.wait(self.every_s)

    def peak(self) -> dict[str, Any]:
        samples = list(self.samples)
        if not samples:
            return {"rss_mb": None, "fds": None, "samples": 0}
        rss = max(x["rss_mb"] for x in samples)
        hwm = samples[-1]["hwm_mb"]
        if self.first and hwm > self.first["hwm_mb"]:  # the process's high-water mark rose meanwhile: a peak
            rss = max(rss, hwm)                         # between two samples counts too
        return {"rss_mb": rss, "fds": max(x["fds"] for x in samples), "samples": len(samples)}


class Attacker:
    """One attack's process (``python -m lyre.benchmarks.attacks``), stopped by its pid."""

    def __init__(self, name: str, settings: dict[str, Any], http: str, key: str):
        self.name = name
        self._stderr = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "lyre.benchmarks.attacks", name,
                                      json.dumps({"http": http, **settings})],
                                     stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                     env={**os.environ, KEY_ENV: key})
        self.pid = self.proc.pid

    def wait_ready(self, timeout_s: float) -> dict[str, Any] | None:
        """What the attack had in place when it said so; None if it did not within ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while (left := end - time.monotonic()) > 0:
            if not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            line = self.proc.stdout.readline()
            if not line:  # it exited
                return None
            message = _json_line(line)
            if "ready" in message:
                return message["ready"]
        return None

    def stop(self, timeout_s: float = 20.0) -> dict[str, Any]:
        killed = False
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)  # our own process, by its id
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            killed = True
            out, _ = self.proc.communicate()
        counts = next((m for m in map(_json_line, reversed(out.splitlines())) if "counts" in m), {})
        self._stderr.seek(0)
        errors = self._stderr.read()[-1500:]
        self._stderr.close()
        return {"pid": self.pid, "exit_code": self.proc.returncode, "killed": killed,
                "stopped": not Path(f"/proc/{self.pid}").exists(), "counts": counts.get("counts", {}),
                "examples": counts.get("examples", {}), "ran_s": counts.get("ran_s"), **({"stderr": errors} if self.proc.returncode else {})}


def _json_line(line: str) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


# --------------------------------------------------------------------------------------------
# report


def verdict(phase: dict[str, Any], quiet: dict[str, Any], idle: dict[str, Any]) -> list[str]:
    """The goals ``phase`` missed (empty: it met them all)."""
    if "skipped" in phase:
        return ["ran"]
    v, missed = phase["victim"], []
    if v["success_rate"] != GOALS["success_rate"]:
        missed.append("success")
    ratio = ttfb_ratio(phase, quiet)
    if ratio is None or ratio > GOALS["ttfb_p95_x_quiet"]:
        missed.append("ttfb")
    if phase["peak"]["rss_mb"] is None or phase["peak"]["rss_mb"] > GOALS["peak_rss_x_idle"] * idle["rss_mb"]:
        missed.append("rss")
    health = v["health"]
    if health["ok"] < health["polls"] or (health["max_ms"] or 0) > GOALS["health_max_ms"]:
        missed.append("health")
    if not phase["after"]["returned"]:
        missed.append("idle")
    return missed


def ttfb_ratio(phase: dict[str, Any], quiet: dict[str, Any]) -> float | None:
    p95, base = phase["victim"]["speech"]["ttfb_ms_p95"], quiet.get("victim", {}).get("speech", {}).get("ttfb_ms_p95")
    return None if p95 is None or not base else p95 / base


def table(r: dict[str, Any]) -> str:
    idle, quiet = r["idle"], r["phases"][0]
    f = lambda v, spec=".0f": "-" if v is None else format(v, spec)  # noqa: E731
    seconds = lambda ms: "-" if ms is None else f"{ms / 1000:.1f} s"  # noqa: E731  (the slowest that succeeded)
    lines = [f"{'phase':<18}{'victim ok':>10}{'TTFB p50 ms':>13}{'p95':>7}{'p95/quiet':>10}{'verify':>8}{'enroll':>8}"
             f"{'health max':>11}{'peak RSS MB':>12}{'/idle':>7}{'peak fds':>9}{'back to idle':>14}  verdict"]
    for p in r["phases"]:
        if "skipped" in p:
            lines.append(f"{LABELS[p['phase']]:<18}  skipped: {p['skipped']}")
            continue
        v, after, peak = p["victim"], p["after"], p["peak"]
        back = f"yes {after['settled_s']:.1f} s" if after["returned"] else \
            "no: " + ",".join(k for k, ok in after["back"].items() if not ok)
        rss_x = peak["rss_mb"] / idle["rss_mb"] if peak["rss_mb"] else None
        lines.append(f"{LABELS[p['phase']]:<18}{v['ok']:>6}/{v['calls']:<3}{f(v['speech']['ttfb_ms_p50']):>13}"
                     f"{f(v['speech']['ttfb_ms_p95']):>7}{f(ttfb_ratio(p, quiet), '.2f'):>9}x"
                     f"{seconds(v['verify']['max_ms']):>8}{seconds(v['enroll']['max_ms']):>8}{f(v['health']['max_ms']):>8} ms{f(peak['rss_mb']):>12}{f(rss_x, '.2f'):>6}x{f(peak['fds']):>9}"
                     f"{back:>14}  {'ok' if not p['verdict'] else 'misses ' + ', '.join(p['verdict'])}")
    lines.append(f"idle: RSS {idle['rss_mb']:.0f} MB, {idle['fds']} descriptors (RLIMIT_NOFILE "
                 f"{r['nofile']}). Goals: victim ok 100%, TTFB p95 <= {GOALS['ttfb_p95_x_quiet']:g}x quiet, "
                 f"peak RSS <= {GOALS['peak_rss_x_idle']:g}x idle, /health <= {GOALS['health_max_ms']:.0f} ms, "
                 "back to idle after")
    for p in r["phases"]:
        a = p.get("attack")
        if not a:
            continue
        top = ", ".join(f"{k} {n}" for k, n in sorted(a["counts"].items(), key=lambda kv: -kv[1])[:6])
        errors = "; ".join(e[:90] for e in p["victim"]["errors"][:2])
        lines.append(f"  {LABELS[p['phase']]:<17} pid {a['pid']} {'stopped' if a['stopped'] else 'STILL RUNNING'} "
                     f"(exit {a['exit_code']}{', killed' if a['killed'] else ''})"
                     f"{'' if a['ready'] is not None else ', never ready'}; {top}; server log +{p['log_bytes'] / 1024:.0f} KB"
                     + (f"; victim: {errors}" if errors else ""))
    return "\n".join(lines)
