"""The attackers of ``benchmark.py --mode isolation``, each run as a process of its own that the
benchmark starts and stops by its pid:

    python -m lyre.benchmarks.attacks NAME '{"http": "http://127.0.0.1:PORT", ...settings}'

The attacker's API key comes in the environment (``LYRE_ATTACK_KEY``), not in argv. Every
connection is made from ``source`` (default 127.0.0.2), so the server sees the attacker as another
address than the victim's. Once its attack is in place the process prints one JSON line
``{"ready": {...}}``; on SIGTERM it stops, prints ``{"counts": {...}, "examples": {...}}`` (what
happened to each thing it tried: ``opened``, ``http_429``, ``ConnectionResetError``, ...; the first
message of each kind of refusal) and exits 0 at once. Failures are what an attack expects: they
are counted and retried, never raised.

- ``half_open``: TCP connections to the REST port that send half a request line and wait, up to
  ``connections`` of them (reopened when the server closes one); the attacker raises its own soft
  descriptor limit to the hard one first.
- ``account_flood``: the attacker's account keeps ``sockets`` WebSockets with ``contexts``
  contexts each and ``rest_streams`` REST speech streams open, every one a long text of
  ``max_tokens`` (= ``min_tokens``) per piece, read as fast as it comes; each one that ends is
  reopened.
- ``stalled_verify``: ``uploads`` POSTs to ``/v1/audio/verify`` that declare ``declared_bytes`` of
  WAV, send ``sent_bytes`` and stall (a new one when the server answers or closes one).
- ``enrollment_flood``: ``enrollers`` loops enrolling a ``clip_seconds`` clip (``POST /v1/voices``)
  and deleting the voice made, so the account's voice limit never stops them.
- ``oversized_audio``: ``uploaders`` loops uploading, to enrollment and to verify in turn, WAVs of 8
  channels at 384 kHz, a WAV whose header declares hours, and an 8-channel 384 kHz FLAC of
  ``seconds`` (near silence: a small file, a large decode).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import resource
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import websockets

from lyre.benchmarks.attack_audio import oversized_files, wav

KEY_ENV = "LYRE_ATTACK_KEY"
ATTACKER_ADDRESS = "127.0.0.2"  # loopback, but another client address than the victim's
LONG_TEXT = ("The attacker reads this long passage aloud, again and again, to hold the server. "
             "Every sentence of it is one more long piece of speech. It never stops talking. "
             "Nobody else should notice that it is here at all.")
TRANSCRIPT = "This is the reference recording of a voice enrolled again and again by one account."
CONSENT = json.dumps({"granted": True, "speaker": "the benchmark's attacker", "source": "self_recorded",
                      "statement": "benchmark.py --mode isolation"})
RETRY_S = 0.5  # after a refusal or a failure, before the next try


@dataclass
class Attack:
    """What an attack function gets: its settings, the key, and where to count and say ready."""

    settings: dict[str, Any]
    key: str
    counts: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # the first message of each kind of refusal
    placed: int = 0  # things in place so far (see place)
    _ready: bool = False

    @property
    def http(self) -> str:
        return self.settings["http"]

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.http)
        return parts.hostname, parts.port

    @property
    def source(self) -> tuple[str, int]:
        return self.settings.get("source", ATTACKER_ADDRESS), 0

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def count(self, what: str, n: int = 1, message: str | None = None) -> None:
        self.counts[what] += n
        if message and what not in self.examples:
            self.examples[what] = message[:200]

    def failed(self, e: BaseException) -> None:
        self.count("TimeoutError" if isinstance(e, asyncio.TimeoutError) else type(e).__name__, message=str(e))

    def place(self, units: int) -> None:
        """One more thing in place; ready once all ``units`` are."""
        self.placed += 1
        if self.placed >= units:
            self.ready()

    def ready(self) -> None:
        if not self._ready:
            self._ready = True
            print(json.dumps({"ready": {"placed": self.placed, **self.counts}}), flush=True)

    def session(self, **timeout: float) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, local_addr=self.source),
                                     timeout=aiohttp.ClientTimeout(**timeout))


FAILURES = (OSError, asyncio.TimeoutError, aiohttp.ClientError, websockets.WebSocketException, ValueError)


# --------------------------------------------------------------------------------------------
# the attacks


async def half_open(a: Attack) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    target, timeout = a.settings["connections"], a.settings.get("connect_timeout_s", 3.0)
    host, port = a.address
    gate = asyncio.Semaphore(64)  # connects under way at once
    live = connecting = 0

    async def hold() -> None:
        nonlocal live, connecting
        try:
            async with gate:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, local_addr=a.source),
                                                        timeout)
                writer.write(b"GET /v1/mod")  # half a request line, never finished
                await writer.drain()
        except FAILURES as e:
            a.failed(e)
            return
        finally:
            connecting -= 1
        a.count("opened")
        live += 1
        try:
            while await reader.read(65536):
                a.count("answered")  # (an error response, or a timeout's)
            a.count("closed_by_server")
        except FAILURES as e:
            a.failed(e)
        finally:
            live -= 1
            writer.close()

    tasks: set[asyncio.Task] = set()
    while True:  # keep ``target`` open: those that failed or were closed are tried again
        tasks = {t for t in tasks if not t.done()}
        connecting += target - len(tasks)
        tasks |= {asyncio.create_task(hold()) for _ in range(target - len(tasks))}
        while connecting:
            await asyncio.sleep(0.05)
        a.counts["holding"] = live
        a.ready()
        await asyncio.sleep(RETRY_S)


async def account_flood(a: Attack) -> None:
    s = a.settings
    tokens = {"max_tokens": s["max_tokens"], "min_tokens": s["max_tokens"]}
    units = s["sockets"] + s["rest_streams"]
    ws_url = a.http.replace("http://", "ws://") + "/v1/audio/stream"

    serials = itertools.count()

    async def keep_contexts(ws) -> None:
        open_ids: set[str] = set()

        async def open_context() -> None:
            cid = f"c{next(serials)}"
            open_ids.add(cid)
            await ws.send(json.dumps({"context_id": cid, "append": LONG_TEXT, **tokens}))
            await ws.send(json.dumps({"context_id": cid, "end": True}))
            a.count("contexts_opened")

        for _ in range(s["contexts"]):
            await open_context()
        a.place(units)
        async for raw in ws:
            message = json.loads(raw)
            if message.get("type") == "audio":
                a.count("ws_audio_chunks")
                continue
            if "error" in message:
                a.count(f"ws_{message['error'].get('code')}", message=message["error"].get("message"))
            elif message.get("done"):
                a.count("contexts_done")
            if message.get("context_id") in open_ids:  # it ended (or was refused): another takes its place
                open_ids.discard(message["context_id"])
                if "error" in message:
                    await asyncio.sleep(RETRY_S)
                await open_context()

    async def socket() -> None:
        while True:
            try:
                async with websockets.connect(ws_url, additional_headers=a.auth, max_size=None,
                                              local_addr=a.source) as ws:
                    await keep_contexts(ws)
            except FAILURES as e:
                a.failed(e)
            a.place(units)
            await asyncio.sleep(RETRY_S)

    async def rest(session: aiohttp.ClientSession) -> None:
        body = {"input": LONG_TEXT, "response_format": "pcm", **tokens}
        while True:
            try:
                async with session.post(a.http + "/v1/audio/speech", json=body, headers=a.auth) as r:
                    a.place(units)
                    if r.status != 200:
                        a.count(f"rest_http_{r.status}", message=await r.text())
                        await asyncio.sleep(RETRY_S)
                        continue
                    a.count("rest_http_200")
                    async for _ in r.content.iter_any():
                        pass
            except FAILURES as e:
                a.failed(e)
                a.place(units)
                await asyncio.sleep(RETRY_S)

    async with a.session() as session:
        await asyncio.gather(*(socket() for _ in range(s["sockets"])),
                             *(rest(session) for _ in range(s["rest_streams"])))


async def stalled_verify(a: Attack) -> None:
    s = a.settings
    host, port = a.address
    head = (f"POST /v1/audio/verify HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {a.key}\r\n"
            f"Content-Type: audio/wav\r\nContent-Length: {s['declared_bytes']}\r\n\r\n").encode()
    body = wav(np.zeros((1, s["sent_bytes"] // 2), np.int16), 24000,
               declared_frames=(s["declared_bytes"] - 44) // 2)[:s["sent_bytes"]]

    async def upload() -> None:
        while True:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, local_addr=a.source), 5)
                try:
                    writer.write(head + body)
                    await writer.drain()
                    a.count("stalled")
                    a.place(s["uploads"])
                    answer = await reader.read(65536)  # until the server answers or closes
                    status = answer.split(b" ")[1:2] if answer.startswith(b"HTTP/") else []
                    a.count(f"http_{status[0].decode(errors='replace')}" if status else "closed_by_server",
                            message=answer.decode(errors="replace"))
                finally:
                    writer.close()
            except FAILURES as e:
                a.failed(e)
                a.place(s["uploads"])
            await asyncio.sleep(RETRY_S)

    await asyncio.gather(*(upload() for _ in range(s["uploads"])))


async def enrollment_flood(a: Attack) -> None:
    from lyre.benchmarks.voices import generated_clip

    s = a.settings
    clip = generated_clip(s["clip_seconds"])

    async def enroller(session: aiohttp.ClientSession, i: int) -> None:
        n = 0
        while True:
            n += 1
            try:
                r = await _enroll(session, a, clip, f"flood-{i}-{n}")
                if r is None:
                    await asyncio.sleep(RETRY_S)
            except FAILURES as e:
                a.failed(e)
                await asyncio.sleep(RETRY_S)
            a.place(s["enrollers"])

    async with a.session(total=600) as session:
        await asyncio.gather(*(enroller(session, i) for i in range(s["enrollers"])))


async def oversized_audio(a: Attack) -> None:
    s = a.settings
    files = oversized_files(s["seconds"], s.get("max_bytes", 9_500_000))

    async def uploader(session: aiohttp.ClientSession, i: int) -> None:
        k = i
        while True:
            name, data = files[k % len(files)]
            endpoint = "verify" if (k // len(files)) % 2 else "enroll"
            k += 1
            try:
                if endpoint == "enroll":
                    await _enroll(session, a, data, f"big-{i}-{k}", label=f"{name}_enroll",
                                  filename="clip.flac" if name.startswith("flac") else "clip.wav")
                else:
                    async with session.post(a.http + "/v1/audio/verify", data=data, headers=a.auth) as r:
                        a.count(f"{name}_verify_http_{r.status}", message=_refusal(r.status, await r.read()))
            except FAILURES as e:
                a.failed(e)
                await asyncio.sleep(RETRY_S)
            a.place(s["uploaders"])

    async with a.session(total=600) as session:
        await asyncio.gather(*(uploader(session, i) for i in range(s["uploaders"])))


async def _enroll(session: aiohttp.ClientSession, a: Attack, audio: bytes, name: str, label: str = "enroll",
                  filename: str = "clip.wav") -> str | None:
    """Enroll ``audio`` and delete the voice made; its id, or None when refused."""
    form = aiohttp.FormData(default_to_multipart=True)
    form.add_field("audio", audio, filename=filename)
    form.add_field("transcript", TRANSCRIPT)
    form.add_field("name", name)
    form.add_field("consent", CONSENT)
    async with session.post(a.http + "/v1/voices", data=form, headers=a.auth) as r:
        a.count(f"{label}_http_{r.status}", message=_refusal(r.status, await r.read()))
        if r.status != 201:
            return None
        body = await r.json()  # (read already: aiohttp keeps the body)
    async with session.delete(f"{a.http}/v1/voices/{body['id']}", headers=a.auth) as d:
        a.count(f"delete_http_{d.status}")
    return body["id"]


def _refusal(status: int, body: bytes) -> str | None:
    return body.decode(errors="replace") if status >= 300 else None


ATTACKS: dict[str, Callable[[Attack], Awaitable[None]]] = {
    "half_open": half_open, "account_flood": account_flood, "stalled_verify": stalled_verify,
    "enrollment_flood": enrollment_flood, "oversized_audio": oversized_audio,
}


# --------------------------------------------------------------------------------------------
# the process


async def _run(attack: Attack, run: Callable[[Attack], Awaitable[None]]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    task = asyncio.create_task(run(attack))
    loop.call_later(attack.settings.get("ready_after_s", 30.0), attack.ready)  # in place or not
    await asyncio.wait([task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    if task.done() and task.exception() is not None:  # (an attack runs until stopped: this is a bug)
        attack.count(f"crashed: {type(task.exception()).__name__}: {task.exception()}")
        attack.ready()
        await stop.wait()


def main(argv: list[str]) -> int:
    name, settings = argv[0], json.loads(argv[1])
    attack = Attack(settings, os.environ.get(KEY_ENV, ""))
    started = time.monotonic()
    # not asyncio.run: it would cancel the attack's tasks and wait for each to close (below)
    asyncio.new_event_loop().run_until_complete(_run(attack, ATTACKS[name]))
    print(json.dumps({"counts": dict(attack.counts), "examples": attack.examples,
                      "ran_s": round(time.monotonic() - started, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # At once: the kernel closes every socket. Closing them one by one (a WebSocket's closing
    # handshake, a session's connections) could wait on a server the attack has made slow.
    os._exit(code)
