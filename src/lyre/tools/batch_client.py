"""``client.py batch submit|status|download|cancel|list``: batch jobs over REST (``/v1/batches``).

A JSONL file of requests, one JSON object a line, is submitted as one batch; its progress is followed
with a progress bar (tqdm, on stderr) until its status is final; its results are downloaded into a
folder (output.jsonl, errors.jsonl and each completed item's audio, every file checked against its
sha256 in the output file).

``client.py`` (the repository's command-line client) wires this in with :func:`add_batch_parser`
and hands a parsed ``batch`` command to :func:`run_batch`. Only the standard library is imported
here: aiohttp and tqdm are imported when a command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import re
import sys
import time
from pathlib import Path
from urllib.parse import quote

__all__ = ["Batches", "ClientError", "add_batch_parser", "download", "error_text", "run_batch", "wait_for"]


class ClientError(Exception):
    """What the client says and exits 1 on: the server is unreachable, or it answered an error."""


def error_text(body: str) -> str:
    """The message of the server's JSON error body (``{"error": {"message": ...}}``), else the body itself."""
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body.strip()[:300]


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
    message = error_text(body)
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


def run_batch(args) -> int:
    """Run a parsed ``batch`` command (``args.run``, set by :func:`add_batch_parser`): its exit status."""
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
