#!/usr/bin/env python
"""Lyre benchmarks.

  python benchmark.py --mode scaling --concurrent 32 [--find-max --slo "success=1.0,ttfb_p95_ms=150,underruns=0"]
  python benchmark.py --mode all --requests 100 --concurrent 16 --output results.json
  python benchmark.py --mode tuning
  python benchmark.py --mode engine  [--concurrency 1,4,16] [--max-tokens 256] [--slot-order shuffled]
  python benchmark.py --mode service [--concurrency 1,8,16] [--policies fair,deadline] [--codec-modes stream,window]
  python benchmark.py --mode codec [--batches 1,4,16] [--chunk 2] [--runtimes torch,onnxruntime,openvino]
  python benchmark.py --mode soak [--requests 10000] [--concurrent 8] [--disconnect 0.3] [--cancel 0.1]
  python benchmark.py --mode watermark [--requests 20]
  python benchmark.py --mode text [--requests 20]
  python benchmark.py --mode isolation [--requests 12] [--concurrent 2] [--attacks half_open,account_flood] [--quick]
  python benchmark.py --mode batch-fill [--live-levels 0.3,0.7] [--backlog 1000] [--seconds 40]

scaling/all/tuning load a server over --protocol ws|rest|grpc: --url (and --grpc-url) for one that
runs already, else a server the benchmark starts from --config/--set and stops by its process id.
Per request: TTFB, real-time factor, underruns of a player that starts at the first byte. Per run:
TTFB p50/p95/p99, underruns and share of streams with none, success rate, audio seconds per wall
second, and the server's tokens/s from /v1/stats. --protocol rest --format opus (mp3, flac, ...)
measures another response_format: TTFB to its first encoded byte, no underruns. --baseline measures a peer
serving the same checkpoint in the same run: transformers (generate + one SNAC decode, one request at a
time) or llamacpp (llama.cpp's batched decoding of the checkpoint exported to GGUF, f32 or q8_0 with
--set model.quantize=int8, + SNAC over a 4-frame sliding window: what Orpheus servers on a CPU run).
engine: tokens/s of the token engine at each concurrency vs transformers generate, sequential, and
with --baseline llamacpp vs llama.cpp at each concurrency.
service: streams through the library API (no network), per scheduler policy and codec mode.
codec: SNAC decode time per emitted frame, per codec mode and runtime, at each batch size (--family qwen3-tts:
the 12 Hz decoder's, torch streaming, and torch against onnxruntime on its stateless decode of a chunk).
soak: the reliability suite on a server it starts: a soak with disconnects and cancels over all
three protocols (then: slots, sessions and codec states left, RSS growth, error lines), an overload
burst, SIGTERM under load, and hypothesis fuzzing of every surface.
watermark: detection of the output watermark on --requests (20) outputs and espeak-ng speech clips as
WAV, after MP3 128 kbps and 8 kHz mu-law; false positives on unmarked speech; cost next to the codec.
text: text normalisation's cost per sentence (p50/p99 over the 200 call-centre sentences, --requests
rounds) and first audio with it on and off through the library API (its share of TTFB).
isolation: on a server it starts with a victim and an attacker account and RLIMIT_NOFILE --nofile, the
victim's --requests syntheses (at --concurrent, default 2), verifications, enrollments and /health,
quiet and then under each attack (half-open connection flood, one account's sessions and contexts,
stalled verify uploads, enrollment flood, oversized audio), each run by a process started and
stopped by its pid; per phase the server's peak RSS and descriptors and whether they came back.
batch-fill: on a server it starts, the capacity (a batch backlog alone, audio-seconds per second), then
live callers at each --live-levels share of it, --seconds without and --seconds with a backlog of
--backlog batch items: live TTFB p95 ratio, live underruns, batch throughput over the unused capacity.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from lyre.audio.formats import FORMATS
from lyre.benchmarks import batchfill as batchfill_bench
from lyre.benchmarks import codec as codec_bench
from lyre.benchmarks import engine as engine_bench
from lyre.benchmarks import isolation as isolation_bench
from lyre.benchmarks import qwen as qwen_bench
from lyre.benchmarks import qwen_codec as qwen_codec_bench
from lyre.benchmarks import scaling
from lyre.benchmarks import service as service_bench
from lyre.benchmarks import soak as soak_bench
from lyre.benchmarks import text as text_bench
from lyre.benchmarks import watermark as watermark_bench
from lyre.benchmarks.figures import parse_slo
from lyre.config import ConfigError, add_config_arguments, config_from_args
from lyre.model import checkpoint


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be integers >= 1")
    return values


def _codec_modes(p: argparse.ArgumentParser, text: str | None) -> list[str]:
    modes = [x.strip() for x in (text or "").split(",") if x.strip()]
    if set(modes) - {"stream", "window"}:
        p.error("--codec-modes takes stream and/or window")
    return modes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["scaling", "all", "tuning", "engine", "service", "codec", "soak", "watermark",
                                      "isolation", "text", "batch-fill"], required=True)
    add_config_arguments(p)
    load = p.add_argument_group("load (scaling, all, tuning)")
    load.add_argument("--protocol", choices=["ws", "rest", "grpc"], default="ws")
    load.add_argument("--url", help="a running server's http://host:port (default: start one)")
    load.add_argument("--grpc-url", help="its gRPC host:port, with --protocol grpc and --url")
    load.add_argument("--replica-urls", help="with --url at a load balancer: the replicas behind it "
                                             "(http://host:port,...), each asked for its /v1/stats: per-replica "
                                             "sessions and tokens/s, and the server figures summed over them")
    load.add_argument("--concurrent", type=int, help="most concurrent users (default 16; soak: 8)")
    load.add_argument("--levels", type=_int_list, help="concurrency levels to sweep (default 1,2,4,... --concurrent)")
    load.add_argument("--requests", type=int, help="requests per measurement (default 2 x users, at least 4)")
    load.add_argument("--rps", type=float, default=1.0, help="open-loop Poisson arrival rate in --mode all")
    load.add_argument("--texts", help="built-in set (conversational, longform) or a file with one text per line")
    load.add_argument("--voice", help="voice for every request (default: the server's); a comma list measures each "
                                     "in turn on the same server; 'clone' enrolls a cloned voice first (below)")
    load.add_argument("--clone-audio", type=Path, help="--voice clone: the reference recording (default: a "
                                                       "generated 8 s clip)")
    load.add_argument("--clone-transcript", help="--voice clone: its exact transcript")
    load.add_argument("--prefix-cache", help="on,off: one server per setting of the kept reference prefix "
                                             "(voices.prefix_cache_mb; off = 0)")
    load.add_argument("--format", default="pcm", choices=FORMATS,
                      help="REST response_format (default pcm). Another format: TTFB is the first byte of the "
                           "encoded body, audio seconds come from decoding it, underruns are not measured")
    load.add_argument("--speed", type=float, help="REST speed (0.25-4.0, OpenAI's parameter): TTFB and real time of "
                                                 "time-stretched audio")
    load.add_argument("--api-key", help="Bearer token for a server that needs one")
    load.add_argument("--find-max", action="store_true", help="bisect for the largest concurrency meeting --slo")
    load.add_argument("--slo", default="success=1.0,ttfb_p95_ms=150,underruns=0",
                      help='objectives, e.g. "success=1.0,ttfb_p95_ms=150,underruns=0"')
    load.add_argument("--baseline", choices=["transformers", "llamacpp", "reference"],
                      help="also measure a peer in the same run and report ratios: transformers (generate, one "
                           "request at a time) or llamacpp (llama.cpp's batched decoding of the checkpoint as "
                           "GGUF + SNAC over a sliding window, as Orpheus servers on a CPU run; needs .[peer]). "
                           "In --mode engine: llamacpp, or reference (the minimal static-KV decode step on the same "
                           "weights, one CUDA graph on a GPU, eager on a CPU: the engine's step over it per level)")
    load.add_argument("--plot", type=Path, help="PNG: TTFB p50/p95 and real-time streams against concurrency")
    load.add_argument("--grid-policies", default="fair,deadline", help="tuning grid: policies")
    load.add_argument("--grid-batch", default="8,16", help="tuning grid: max_batch_size values")
    load.add_argument("--grid-flush", default="7:14,7:28", help="tuning grid: first:every flush sizes in tokens")
    p.add_argument("--policies", help="scheduler policies to compare (service mode: default fair,deadline; "
                                      "scaling: one server per policy)")
    p.add_argument("--codec-modes", help="codec modes to compare, e.g. stream,window (service and scaling: one "
                                         "server per mode; default: the config's codec.mode)")
    p.add_argument("--max-tokens", type=int, help="tokens per request (engine/service default 256; load modes: "
                                                  "the server's sampling.max_tokens)")
    p.add_argument("--checkpoint", type=Path, help="engine mode: Llama checkpoint directory")
    p.add_argument("--concurrency", type=_int_list, help="engine/service levels (default 1,4,16 / 1,8,16)")
    p.add_argument("--baseline-requests", type=int, default=2, help="engine mode: sequential transformers requests")
    p.add_argument("--slot-order", choices=engine_bench.SLOT_ORDERS, default="admission",
                   help="engine mode: the order step() gets its requests in: admission (default) or shuffled "
                        "anew every step, as the deadline scheduler's order is")
    codec = p.add_argument_group("codec")
    codec.add_argument("--batches", type=_int_list, default=[1, 4, 16], help="streams decoded together (default 1,4,16)")
    codec.add_argument("--chunk", type=int, default=2, help="frames per stream per call (default 2)")
    codec.add_argument("--runtimes", default="torch,onnxruntime,openvino",
                       help="stream-mode runtimes to measure, where installed (default torch,onnxruntime,openvino)")
    soak = p.add_argument_group("soak (--requests default 300, --concurrent default 8)")
    soak.add_argument("--disconnect", type=float, default=0.3, help="share of clients that go away mid-request")
    soak.add_argument("--cancel", type=float, default=0.1, help="share of clients that cancel")
    soak.add_argument("--overload-factor", type=int, default=10, help="overload burst, in multiples of capacity")
    soak.add_argument("--drain-timeout", type=float, default=2.0, help="server.drain_timeout_s of the drain phase")
    soak.add_argument("--fuzz-examples", type=int, default=100, help="fuzz examples per surface")
    soak.add_argument("--seed", type=int, default=0, help="seed of the soak's plan")
    soak.add_argument("--random", action="store_true", help="fuzz with fresh random examples (default: derandomized)")
    iso = p.add_argument_group("isolation (--requests: the victim's syntheses per phase, default 12; --concurrent "
                               "default 2; --max-tokens default 84)")
    iso.add_argument("--attacks", default=",".join(isolation_bench.ATTACKS),
                     help=f"attacks to run, in this order (default {','.join(isolation_bench.ATTACKS)})")
    iso.add_argument("--nofile", type=int, default=1024, help="the server's RLIMIT_NOFILE, soft and hard (default 1024)")
    iso.add_argument("--quick", action="store_true", help="a small run (the test suite's): 3 syntheses per phase, "
                                                          "small attacks, RLIMIT_NOFILE at most 256")
    fill = p.add_argument_group("batch-fill")
    fill.add_argument("--live-levels", default="0.3,0.7", help="live load as shares of the capacity (default 0.3,0.7)")
    fill.add_argument("--backlog", type=int, default=1000, help="batch items submitted in each backlog (default 1000)")
    fill.add_argument("--seconds", type=float, default=40.0, help="length of each phase (default 40)")
    family = p.add_argument_group("model family")
    family.add_argument("--family", choices=["orpheus", "qwen3-tts"], default="orpheus",
                        help="orpheus (default: the configured checkpoint) or qwen3-tts: every mode runs the "
                             "Qwen3-TTS demo checkpoint of --shape (written to models/qwen3-demo-SHAPE if missing); "
                             "--max-tokens then counts 80 ms frames (default 50)")
    family.add_argument("--shape", choices=["tiny", "small"], default="tiny",
                        help="qwen3-tts: tiny (the demo) or small (the real code predictor's depth at half width, a "
                             "third of the talker's layers at half width)")
    family.add_argument("--no-peer", action="store_true", help="--mode engine --family qwen3-tts: without the qwen_tts "
                                                              "reference run")
    p.add_argument("--output", type=Path, help="write every figure, the settings and the machine as JSON")
    return p


def _family(args: argparse.Namespace, say) -> Path | None:
    """With --family qwen3-tts: the demo checkpoint of --shape (written first if missing), served by
    every mode through --set overrides; None for orpheus."""
    if args.family == "orpheus":
        return None
    from lyre.family.qwen3tts import demo as qwen_demo

    path = Path(__file__).resolve().parent / "models" / f"qwen3-demo-{args.shape}"
    if not qwen_demo.demo_is_current(path, shape=args.shape):
        say(f"writing the Qwen3-TTS demo checkpoint ({args.shape}) to {path} ...")
    qwen_demo.ensure_demo(path, shape=args.shape)
    args.overrides = [*(args.overrides or []), f"model.path={path}", "codec.path=null", "model.backend=torch"]
    args.max_tokens = args.max_tokens or 50
    return path


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.concurrent is None:
        args.concurrent = {"soak": 8, "isolation": 2}.get(args.mode, 16)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        if args.baseline == "reference" and (args.mode != "engine" or args.family != "orpheus"):
            p.error("--baseline reference is a peer of --mode engine (Orpheus): the decode step alone")
        qwen_dir = _family(args, say)
        cfg = config_from_args(args)
        if args.mode == "engine" and qwen_dir is not None:
            result = qwen_bench.run(qwen_dir, args.concurrency or [1, 4, 8, 16], args.max_tokens, peer=not args.no_peer,
                                    progress=say)
            text = qwen_bench.table(result)
        elif args.mode == "engine":
            model_dir = args.checkpoint or checkpoint.resolve_model(cfg.model, cfg.codec).llama_dir
            result = engine_bench.run(cfg, model_dir, args.concurrency or [1, 4, 16], args.max_tokens or 256,
                                      args.baseline_requests, progress=say, slot_order=args.slot_order,
                                      baseline=args.baseline)
            text = engine_bench.table(result)
        elif args.mode == "codec":
            runtimes = [x.strip() for x in args.runtimes.split(",") if x.strip()]
            if not runtimes or set(runtimes) - {"torch", "onnxruntime", "openvino"}:
                p.error("--runtimes takes torch, onnxruntime and/or openvino")
            if args.chunk < 1:
                p.error("--chunk must be >= 1")
            if qwen_dir is not None:
                result = qwen_codec_bench.run(args.batches, args.chunk, runtimes, cfg.codec.cpu_threads, progress=say)
                text = qwen_codec_bench.table(result)
            else:
                result = codec_bench.run(cfg, args.batches, args.chunk, runtimes, progress=say)
                text = codec_bench.table(result)
        elif args.mode == "soak":
            settings = soak_bench.SoakSettings(
                requests=args.requests or 300, concurrency=args.concurrent,
                disconnect=args.disconnect, cancel=args.cancel, max_tokens=args.max_tokens or 28,
                overload_factor=args.overload_factor, drain_timeout_s=args.drain_timeout,
                fuzz_examples=args.fuzz_examples, seed=args.seed, derandomize=not args.random)
            if not (0 <= settings.disconnect + settings.cancel <= 1) or settings.requests < 1:
                p.error("--disconnect + --cancel must be within [0, 1] and --requests >= 1")
            result = soak_bench.run(args.config, cfg, tuple(args.overrides), settings, progress=say)
            text = soak_bench.table(result)
        elif args.mode == "isolation":
            attacks = tuple(x.strip() for x in args.attacks.split(",") if x.strip())
            if set(attacks) - set(isolation_bench.ATTACKS) or args.url:
                p.error(f"--attacks takes {', '.join(isolation_bench.ATTACKS)}; the mode starts its own server (no --url)")
            if args.nofile < 64 or (args.requests is not None and args.requests < 1) or args.concurrent < 1:
                p.error("--nofile must be >= 64, --requests and --concurrent >= 1")
            settings = isolation_bench.IsolationSettings(
                victim=isolation_bench.VictimSettings(requests=args.requests or 12, concurrency=args.concurrent,
                                                      max_tokens=args.max_tokens or 84),
                attacks=attacks, nofile=args.nofile, sizes=isolation_bench.attack_sizes(args.nofile, False))
            if args.quick:
                settings = isolation_bench.quick(settings)
            result = isolation_bench.run(args.config, tuple(args.overrides), settings, progress=say)
            text = isolation_bench.table(result)
        elif args.mode == "batch-fill":
            try:
                levels = tuple(float(x) for x in args.live_levels.split(",") if x.strip())
            except ValueError:
                levels = ()
            if not levels or not all(0 < x < 1 for x in levels) or args.backlog < 1 or args.seconds <= 0 or args.url:
                p.error("--live-levels takes shares in (0, 1), --backlog >= 1, --seconds > 0; the mode starts its own "
                        "server (no --url)")
            settings = batchfill_bench.BatchFillSettings(levels=levels, backlog=args.backlog, seconds=args.seconds)
            result = batchfill_bench.run(args.config, tuple(args.overrides), settings, progress=say)
            text = batchfill_bench.table(result)
        elif args.mode == "watermark":
            result = watermark_bench.run(cfg, args.requests or 20, progress=say)
            text = watermark_bench.table(result)
        elif args.mode == "text":
            result = text_bench.run(cfg, args.requests or 20, progress=say)
            text = text_bench.table(result)
        elif args.mode == "service":
            policies = [x.strip() for x in (args.policies or "fair,deadline").split(",") if x.strip()]
            if not policies or set(policies) - {"fair", "deadline"}:
                p.error("--policies takes fair and/or deadline")
            result = service_bench.run(cfg, args.concurrency or [1, 8, 16], policies, args.max_tokens or 256,
                                       codec_modes=_codec_modes(p, args.codec_modes) or [cfg.codec.mode],
                                       progress=say)
            text = service_bench.table(result)
        else:
            if args.format != "pcm" and args.protocol != "rest":
                p.error("--format is for --protocol rest (WebSocket and gRPC load use PCM)")
            if args.format != "pcm" and (args.plot or args.find_max and
                                         {"underruns", "real_time_share"} & set(parse_slo(args.slo))):
                p.error(f"--format {args.format} measures no underruns: --plot and an --slo with underruns or "
                        "real_time_share need --format pcm")
            if args.protocol == "grpc" and args.url and not args.grpc_url:
                p.error("--protocol grpc with --url needs --grpc-url host:port")
            if args.policies and set(args.policies.split(",")) - {"fair", "deadline"}:
                p.error("--policies takes fair and/or deadline")
            _codec_modes(p, args.codec_modes)
            if args.replica_urls and not args.url:
                p.error("--replica-urls names the servers behind --url (a load balancer)")
            if args.prefix_cache and (set(args.prefix_cache.split(",")) - {"on", "off"} or args.url):
                p.error("--prefix-cache takes on and/or off, and starts one server per setting (no --url)")
            if args.clone_audio and not args.clone_audio.is_file():
                p.error(f"--clone-audio {args.clone_audio}: no such file")
            if args.codec_modes and args.url:
                p.error("--codec-modes starts one server per mode: it needs a server the benchmark owns (no --url)")
            run = {"scaling": scaling.run_scaling, "all": scaling.run_all}.get(args.mode)
            result = run(args, say) if run else scaling.run_tuning(args, cfg, say)
            result["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
            result["machine"] = scaling.machine()
            text = scaling.summary_text(result)
            if args.plot:
                if "engines" not in result:
                    p.error("--plot draws the concurrency sweep of --mode scaling or all")
                scaling.plot(result, args.plot)
                say(f"wrote {args.plot}")
    except (ConfigError, checkpoint.CheckpointError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(text)
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        say(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
