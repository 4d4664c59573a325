#!/usr/bin/env python
"""Lyre client: speak one text over REST, WebSocket or gRPC and save the audio.

  python client.py --text "Hello world" --output test.wav
  python client.py --text "Hello" --protocol ws --format pcm --output hello.pcm
  python client.py --text "Hello" --protocol grpc --url localhost:50051 --format mulaw --output hello.ulaw

Prints the time to first audio byte, the audio duration and the real-time factor (wall time /
audio time). Exits non-zero with a clear message when the server is unreachable or answers an error.

Batch jobs (REST: /v1/batches), a JSONL file of requests, one JSON object a line:

  python client.py batch submit requests.jsonl --wait --output results/
  python client.py batch status BATCH_ID --wait
  python client.py batch download BATCH_ID results/
  python client.py batch cancel BATCH_ID
  python client.py batch list
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import io
import json
import re
import sys
import time
import wave
from pathlib import Path
from urllib.parse import quote

FORMATS = ("wav", "pcm", "mp3", "opus", "aac", "flac", "mulaw", "alaw")
GRPC_FORMATS = ("wav", "pcm", "mulaw", "alaw")


class ClientError(Exception):
    pass


def audio_seconds(data: bytes, fmt: str, rate: int) -> float:
    if fmt == "pcm":
        return len(data) / 2 / rate
    if fmt in ("mulaw", "alaw"):
        return len(data) / rate
    if fmt == "wav":
        return max(0, len(data) - 44) / 2 / rate
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return samples / stream.rate


async def via_rest(args) -> tuple[bytes, float, int]:
    import aiohttp

    body = {"input": args.text, "voice": args.voice, "response_format": args.format}
    if args.sample_rate:
        body["sample_rate"] = args.sample_rate
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = args.url.rstrip("/") + "/v1/audio/speech"
    t0 = time.perf_counter()
    try:
        async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                raise ClientError(f"the server answered {resp.status}: {_error_text(await resp.text())}")
            rate = int(resp.headers.get("X-Sample-Rate", args.sample_rate or 24000))
            parts, ttfb = [], None
            async for chunk in resp.content.iter_any():
                ttfb = ttfb if ttfb is not None else time.perf_counter() - t0
                parts.append(chunk)
    except aiohttp.ClientConnectionError as e:
        raise ClientError(f"cannot reach the server at {args.url} ({e})") from None
    return b"".join(parts), ttfb or 0.0, rate


async def via_ws(args) -> tuple[bytes, float, int]:
    import websockets

    url = args.url.replace("http://", "ws://").replace("https://", "wss://").rstrip("/") + "/v1/audio/stream"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    message = {"text": args.text, "voice": args.voice, "response_format": args.format}
    if args.sample_rate:
        message["sample_rate"] = args.sample_rate
    t0 = time.perf_counter()
    try:
        async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
            await ws.send(json.dumps(message))
            parts, ttfb = [], None
            while True:
                msg = await ws.recv()
                if isinstance(msg, bytes):
                    ttfb = ttfb if ttfb is not None else time.perf_counter() - t0
                    parts.append(msg)
                    continue
                data = json.loads(msg)
                if "error" in data:
                    raise ClientError(f"the server answered: {data['error'].get('message')}")
                if data.get("done"):
                    break
    except (OSError, websockets.exceptions.InvalidStatus, websockets.exceptions.ConnectionClosed) as e:
        raise ClientError(f"cannot talk to the server at {url} ({e})") from None
    return b"".join(parts), ttfb or 0.0, args.sample_rate or (8000 if args.format in ("mulaw", "alaw") else 24000)


async def via_grpc(args) -> tuple[bytes, float, int]:
    import grpc

    from lyre.v1 import tts_pb2, tts_pb2_grpc

    if args.format not in GRPC_FORMATS:
        raise ClientError(f"over gRPC the formats are {', '.join(GRPC_FORMATS)}")
    encoding = {"wav": tts_pb2.LINEAR16, "pcm": tts_pb2.LINEAR16, "mulaw": tts_pb2.MULAW, "alaw": tts_pb2.ALAW}
    request = tts_pb2.SynthesizeRequest(
        text=args.text, voice=args.voice,
        audio=tts_pb2.AudioConfig(encoding=encoding[args.format], sample_rate_hz=args.sample_rate or 0))
    target = args.url.replace("http://", "").replace("grpc://", "").rstrip("/")
    metadata = (("authorization", f"Bearer {args.api_key}"),) if args.api_key else None
    t0 = time.perf_counter()
    parts, ttfb, rate = [], None, 0
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = tts_pb2_grpc.TextToSpeechStub(channel)
            async for chunk in stub.SynthesizeStream(request, metadata=metadata, timeout=args.timeout):
                if chunk.audio:
                    ttfb = ttfb if ttfb is not None else time.perf_counter() - t0
                    parts.append(chunk.audio)
                rate = chunk.sample_rate_hz
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            raise ClientError(f"cannot reach the gRPC server at {target} ({e.details()})") from None
        raise ClientError(f"the server answered {e.code().name}: {e.details()}") from None
    data = b"".join(parts)
    if args.format == "wav":  # gRPC carries raw PCM: wrap it
        out = io.BytesIO()
        with wave.open(out, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes(data)
        data = out.getvalue()
    return data, ttfb or 0.0, rate


def _error_text(body: str) -> str:
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body.strip()[:300]


# --------------------------------------------------------------------------------------------
# batch jobs: client.py batch submit|status|download|cancel|list (REST, /v1/batches)

FINAL = ("completed", "cancelled", "expired", "failed")  # a batch's status once nothing more will run
ENDED = ("completed", "failed", "cancelled", "expired")  # request_counts of the items that have ended
POLL_S = 1.0
READ_TIMEOUT_S = 300.0


class Batches:
    """The server's /v1/batches over one aiohttp session; an HTTP error is a ClientError with its message."""

    def __init__(self, session, url: str, api_key: str | None):
        self.session, self.base = session, url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @contextlib.asynccontextmanager
    async def request(self, method: str, path: str, headers: dict | None = None, **kw):
        import aiohttp

        url = path if path.startswith(("http://", "https://")) else self.base + path
        try:
            async with self.session.request(method, url, headers={**self.headers, **(headers or {})}, **kw) as resp:
                if resp.status >= 400:
                    raise ClientError(_batch_error(resp.status, await resp.text()))
                yield resp
        except aiohttp.ClientError as e:
            raise ClientError(f"cannot talk to the server at {self.base} ({e or type(e).__name__})") from None

    async def json(self, method: str, path: str, **kw) -> dict:
        async with self.request(method, path, **kw) as resp:
            try:
                return json.loads(await resp.read())
            except ValueError:
                raise ClientError(f"the server's answer to {method} {path} is not JSON") from None

    async def save(self, path: str, target: Path) -> str:
        """Stream ``path``'s body into ``target``: its sha256 (hex)."""
        digest = hashlib.sha256()
        async with self.request("GET", path) as resp:
            with target.open("wb") as f:
                async for chunk in resp.content.iter_chunked(1 << 16):
                    digest.update(chunk)
                    f.write(chunk)
        return digest.hexdigest()


def _batch_error(status: int, body: str) -> str:
    """The server's error message, then each bad line of a refused input (``line N: message``)."""
    try:
        lines = json.loads(body)["error"].get("lines") or []
    except (ValueError, KeyError, TypeError, AttributeError):
        lines = []
    bad = [f"\n  line {p.get('line')}: {p.get('message')}" for p in lines if isinstance(p, dict)]
    message = _error_text(body)
    if bad:  # (its message names the first few bad lines too: they follow, one a line)
        message = message.split(": line ", 1)[0] + ":"
    return f"the server answered {status}: {message}" + "".join(bad)


def _batch_path(batch_id: str, tail: str = "") -> str:
    return f"/v1/batches/{quote(batch_id, safe='')}{tail}"


def _facts(batch: dict) -> str:
    c = batch.get("request_counts") or {}
    counts = ", ".join(f"{c.get(k, 0)} {k}" for k in ("completed", "failed", "queued", "running", "cancelled",
                                                      "expired"))
    times = ", ".join(f"{k.removesuffix('_at')} {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(batch[k]))}"
                      for k in ("created_at", "completed_at", "cancelling_at", "cancelled_at", "expired_at",
                                "expires_at") if batch.get(k))
    lines = [f"{batch['id']}: {batch['status']}", f"  items: {c.get('total', 0)} ({counts})", f"  {times}"]
    if batch.get("metadata"):
        lines.append(f"  metadata: {json.dumps(batch['metadata'], ensure_ascii=False)}")
    return "\n".join(lines)


def _show(batch: dict, as_json: bool) -> None:
    print(json.dumps(batch) if as_json else _facts(batch), flush=True)


async def wait_for(api: Batches, batch: dict) -> dict:
    """A progress bar over the batch's ended items, asking every POLL_S until its status is final."""
    from tqdm import tqdm

    with tqdm(total=batch["request_counts"]["total"], unit="item", desc=batch["id"]) as bar:
        while True:
            counts = batch["request_counts"]
            bar.n = sum(counts.get(k, 0) for k in ENDED)
            bar.set_postfix({"status": batch["status"], "failed": counts.get("failed", 0)})
            if batch["status"] in FINAL:
                return batch
            await asyncio.sleep(POLL_S)
            batch = await api.json("GET", _batch_path(batch["id"]))


def _file_name(item: dict, taken: set[str]) -> str:
    """``<custom_id>.<response_format>``, sanitised; made unique with a hash of the custom_id when needed."""
    custom_id = str(item["custom_id"])
    stem = re.sub(r"[^\w.-]", "_", custom_id, flags=re.ASCII).lstrip(".")[:100] or "_"
    ext = re.sub(r"\W", "", str(item.get("response_format")), flags=re.ASCII) or "audio"
    name = f"{stem}.{ext}"
    if name in taken or name in ("output.jsonl", "errors.jsonl"):
        name = f"{stem}-{hashlib.sha256(custom_id.encode()).hexdigest()[:10]}.{ext}"
    taken.add(name)
    return name


async def download(api: Batches, batch_id: str, folder: Path) -> int:
    """output.jsonl, errors.jsonl and each completed item's audio into ``folder``, each file checked
    against its sha256 in the output file (a file that differs is not kept: exit 1)."""
    from tqdm import tqdm

    batch = await api.json("GET", _batch_path(batch_id))
    folder.mkdir(parents=True, exist_ok=True)
    await api.save(_batch_path(batch_id, "/output"), folder / "output.jsonl")
    await api.save(_batch_path(batch_id, "/errors"), folder / "errors.jsonl")
    items = [json.loads(line) for line in (folder / "output.jsonl").read_text().splitlines() if line.strip()]
    failed = sum(1 for line in (folder / "errors.jsonl").read_text().splitlines() if line.strip())
    bad, taken = 0, set()
    for item in tqdm(items, unit="file", desc="download"):
        target = folder / _file_name(item, taken)
        part = target.with_name(target.name + ".part")
        digest = await api.save(item["audio_url"], part)
        if digest != item.get("sha256"):
            part.unlink()
            bad += 1
            tqdm.write(f"error: the audio of {item['custom_id']!r} has sha256 {digest}, the output file says "
                       f"{item.get('sha256')}: not kept", file=sys.stderr)
            continue
        part.replace(target)
    print(f"wrote {len(items) - bad} audio files, output.jsonl and errors.jsonl ({failed} items that did not "
          f"complete) to {folder}")
    if batch["status"] not in FINAL:
        print(f"the batch is {batch['status']}: what completes later is not here yet")
    return 1 if bad else 0


async def batch_submit(api: Batches, args) -> int:
    try:
        data = args.file.read_bytes()
    except OSError as e:
        raise ClientError(f"cannot read {args.file} ({e.strerror})") from None
    params = {k: v for k, v in (("completion_window", args.window), ("metadata", args.metadata)) if v is not None}
    headers = {"Content-Type": "application/jsonl"}
    if args.idempotency_key:
        headers["Idempotency-Key"] = args.idempotency_key
    batch = await api.json("POST", "/v1/batches", data=data, params=params, headers=headers)
    print(json.dumps(batch) if args.json else batch["id"], flush=True)
    if not (args.wait or args.output_dir):
        return 0
    batch = await wait_for(api, batch)
    _show(batch, args.json)
    return await download(api, batch["id"], args.output_dir) if args.output_dir else 0


async def batch_status(api: Batches, args) -> int:
    batch = await api.json("GET", _batch_path(args.batch_id))
    _show(await wait_for(api, batch) if args.wait else batch, args.json)
    return 0


async def batch_download(api: Batches, args) -> int:
    return await download(api, args.batch_id, args.folder)


async def batch_cancel(api: Batches, args) -> int:
    batch = await api.json("POST", _batch_path(args.batch_id, "/cancel"))
    print(json.dumps(batch) if args.json else f"{batch['id']}: {batch['status']}")
    return 0


async def batch_list(api: Batches, args) -> int:
    page = await api.json("GET", "/v1/batches", params={"limit": str(args.limit), **({"after": args.after}
                                                                                    if args.after else {})})
    for b in page["data"]:
        c = b["request_counts"]
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(b["created_at"]))
        print(json.dumps(b) if args.json else
              f"{b['id']}  {b['status']:<11} {c['completed']}/{c['total']} completed, {c['failed']} failed  {created}")
    if page.get("has_more") and not args.json:
        print(f"(more: --after {page['last_id']})")
    return 0


def add_batch_parser(commands) -> None:
    # --url and --api-key are taken after 'batch' too (before it, the main parser's)
    conn = argparse.ArgumentParser(add_help=False)
    conn.add_argument("--url", default=argparse.SUPPRESS, help="server (default http://localhost:8000)")
    conn.add_argument("--api-key", default=argparse.SUPPRESS, help="sent as a Bearer token")
    conn.add_argument("--json", action="store_true", help="print the batch object(s) as JSON, one a line")
    p = commands.add_parser("batch", help="batch jobs: submit a JSONL file, follow, download, cancel, list",
                            description="Batch jobs (REST, /v1/batches).")
    sub = p.add_subparsers(dest="action", required=True, metavar="{submit,status,download,cancel,list}")
    s = sub.add_parser("submit", parents=[conn], help="send a JSONL file of requests; prints the batch id")
    s.add_argument("file", type=Path, help="JSONL, one request a line (a custom_id and /v1/audio/speech's fields)")
    s.add_argument("--window", help="completion window, e.g. 24h, 90m (default: the server's)")
    s.add_argument("--idempotency-key", help="a resubmission with the same key answers the same batch")
    s.add_argument("--metadata", help='a JSON object of strings, e.g. \'{"campaign": "spring"}\'')
    s.add_argument("--wait", action="store_true", help="show progress until the batch ends")
    s.add_argument("--output", dest="output_dir", type=Path, help="then download it into this folder (implies --wait)")
    s.set_defaults(run=batch_submit)
    s = sub.add_parser("status", parents=[conn], help="a batch's status, counts and times")
    s.add_argument("batch_id")
    s.add_argument("--wait", action="store_true", help="show progress until the batch ends")
    s.set_defaults(run=batch_status)
    s = sub.add_parser("download", parents=[conn], help="output.jsonl, errors.jsonl and each item's audio")
    s.add_argument("batch_id")
    s.add_argument("folder", type=Path)
    s.set_defaults(run=batch_download)
    s = sub.add_parser("cancel", parents=[conn], help="cancel a batch's items not yet ended")
    s.add_argument("batch_id")
    s.set_defaults(run=batch_cancel)
    s = sub.add_parser("list", parents=[conn], help="your batches, newest first")
    s.add_argument("--limit", type=int, default=20, help="1-100 (default 20)")
    s.add_argument("--after", help="a batch id: the page after it")
    s.set_defaults(run=batch_list)


def batch_main(args) -> int:
    args.url = args.url or "http://localhost:8000"
    try:
        return asyncio.run(_run_batch(args))
    except ClientError as e:
        print(f"error: {e}", file=sys.stderr)
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted (a submitted batch goes on: client.py batch status ID)", file=sys.stderr)
        return 130
    return 1


async def _run_batch(args) -> int:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=READ_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return await args.run(Batches(session, args.url, args.api_key), args)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", help="what to say (required, except for 'batch')")
    p.add_argument("--output", type=Path, default=Path("output.wav"), help="audio file to write (default output.wav)")
    p.add_argument("--protocol", choices=["rest", "ws", "grpc"], default="rest")
    p.add_argument("--voice", default="tara")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="audio format (default: from the output file's extension, else wav)")
    p.add_argument("--sample-rate", type=int, help="8000..48000 (default 24000; 8000 for mulaw/alaw)")
    p.add_argument("--url", help="server (default http://localhost:8000; localhost:50051 for gRPC)")
    p.add_argument("--api-key", help="sent as a Bearer token when the server requires one")
    p.add_argument("--timeout", type=float, default=300.0, help="gRPC deadline in seconds")
    add_batch_parser(p.add_subparsers(dest="command", title="commands", metavar="batch"))
    args = p.parse_args(argv)
    if args.command == "batch":
        return batch_main(args)
    if args.text is None:
        p.error("the following arguments are required: --text")
    if args.format is None:
        ext = args.output.suffix.lstrip(".").lower()
        args.format = {"ulaw": "mulaw", "ogg": "opus", "raw": "pcm"}.get(ext, ext if ext in FORMATS else "wav")
    args.url = args.url or ("localhost:50051" if args.protocol == "grpc" else "http://localhost:8000")
    run = {"rest": via_rest, "ws": via_ws, "grpc": via_grpc}[args.protocol]
    t0 = time.perf_counter()
    try:
        data, ttfb, rate = asyncio.run(run(args))
    except ClientError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t0
    if not data:
        print("error: the server sent no audio", file=sys.stderr)
        return 1
    args.output.write_bytes(data)
    seconds = audio_seconds(data, args.format, rate)
    rtf = wall / seconds if seconds else float("inf")
    print(f"wrote {args.output} ({args.format}, {len(data)} bytes)")
    print(f"TTFB {1000 * ttfb:.0f} ms, audio {seconds:.2f} s, real-time factor {rtf:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
