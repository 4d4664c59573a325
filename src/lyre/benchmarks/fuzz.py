"""Fuzzing a running server with hypothesis: REST bodies and headers, WebSocket message sequences,
gRPC messages (and raw bytes). Every answer must be a success or a clear client error: never a
5xx, an INTERNAL/UNKNOWN status, a hang, or a socket closed without an error frame.

Examples are drawn by hypothesis (``derandomize`` for a repeatable run), then sent in order.
"""

from __future__ import annotations

import asyncio
import json
import string
from typing import Any

import aiohttp
import grpc
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lyre.service.options import SpeechBody, WsMessage
from lyre.v1 import tts_pb2, tts_pb2_grpc

TIMEOUT_S = 60.0  # an answer slower than this is a hang
MAX_TOKENS = 28  # valid token counts are capped, so the fuzz stays short

SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
           | st.sampled_from(["tara", "leo", "pcm", "mp3", "sse", "hi \ud800", "Hello there. ", 10**400, 0, 1]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                             max_size=3), max_leaves=4)
HEADER_TEXT = st.text(alphabet=string.ascii_letters + string.digits + " /;=-_.", max_size=30)


def _cap(d: dict) -> dict:
    """Valid token counts capped at MAX_TOKENS (a valid 100000 would only make the fuzz slow)."""
    for key in ("max_tokens", "min_tokens"):
        v = d.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > MAX_TOKENS:
            d[key] = MAX_TOKENS
    return d


def _fields(names: list[str]) -> st.SearchStrategy[dict]:
    return st.dictionaries(st.sampled_from([*names, "junk", ""]), VALUES, max_size=5).map(_cap)


REST_BODY = st.one_of(
    _fields(list(SpeechBody.model_fields)).map(lambda d: {"input": "Hello there.", **d}),
    _fields(list(SpeechBody.model_fields)),
    st.binary(max_size=40),
)
REST_HEADERS = st.fixed_dictionaries({}, optional={"Content-Type": HEADER_TEXT, "Authorization": HEADER_TEXT,
                                                   "Accept": HEADER_TEXT})
WS_MESSAGE = st.one_of(_fields(list(WsMessage.model_fields)), st.text(max_size=30), st.binary(max_size=20))
WS_SEQUENCE = st.lists(WS_MESSAGE, min_size=1, max_size=6)
GRPC_REQUEST = st.one_of(
    st.builds(lambda text, voice, encoding, rate, sampling: ("message", tts_pb2.SynthesizeRequest(
        text=text, voice=voice, audio=tts_pb2.AudioConfig(encoding=encoding, sample_rate_hz=rate),
        sampling=tts_pb2.SamplingOptions(**sampling))),
        st.text(max_size=40), st.sampled_from(["", "tara", "bob", "x" * 200]), st.integers(0, 5),
        st.sampled_from([0, -1, 8000, 16000, 22050, 96000]),
        st.fixed_dictionaries({}, optional={"temperature": st.floats(width=32), "top_p": st.floats(width=32),
                                            "top_k": st.integers(-(2**31), 2**31 - 1),
                                            "max_tokens": st.integers(-(2**31), MAX_TOKENS),
                                            "seed": st.integers(-(2**63), 2**63 - 1)})),
    st.binary(max_size=40).map(lambda b: ("raw", b)),
)


def draw(strategy: st.SearchStrategy, n: int, derandomize: bool) -> list[Any]:
    """``n`` examples of ``strategy`` as hypothesis generates them."""
    out: list[Any] = []

    @settings(max_examples=n, derandomize=derandomize, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example):
        out.append(example)

    collect()
    return out[:n]


async def rest(http: str, examples: list[tuple[Any, dict]]) -> list[str]:
    """Violations: 5xx, a non-JSON error, a 200 without audio, a hang."""
    bad = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as s:
        for body, headers in examples:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            try:
                async with s.post(http + "/v1/audio/speech", data=data, headers=headers) as r:
                    payload = await r.read()
                    if r.status >= 500:
                        bad.append(f"REST {r.status} for {body!r:.80}: {payload[:200]!r}")
                    elif r.status == 200 and not payload:
                        bad.append(f"REST 200 without audio for {body!r:.80}")
                    elif r.status != 200 and not json.loads(payload)["error"]["message"]:
                        bad.append(f"REST {r.status} without a message for {body!r:.80}")
            except asyncio.TimeoutError:
                bad.append(f"REST hang for {body!r:.80}")
    return bad


async def ws(http: str, sequences: list[list[Any]]) -> list[str]:
    """Each sequence on its own socket, then a probe: the socket must still answer it."""
    bad = []
    url = http.replace("http://", "ws://") + "/v1/audio/stream"
    for seq in sequences:
        try:
            async with websockets.connect(url, max_size=None) as sock:
                for message in seq:
                    await sock.send(message if isinstance(message, (str, bytes)) else json.dumps(message))
                await sock.send(json.dumps({"context_id": "probe", "text": "Still there?", "max_tokens": 14}))
                await asyncio.wait_for(_until_probe(sock, seq, bad), TIMEOUT_S)
        except websockets.ConnectionClosed as e:
            bad.append(f"WebSocket closed ({e}) after {seq!r:.80}")
        except asyncio.TimeoutError:
            bad.append(f"WebSocket hang after {seq!r:.80}")
    return bad


async def _until_probe(sock, seq: list[Any], bad: list[str]) -> None:
    """Read replies until the probe's answer; note error frames that are not clear client errors."""
    while True:
        raw = await sock.recv()
        reply = json.loads(raw) if isinstance(raw, str) else {}
        if reply.get("context_id") == "probe" and ("done" in reply or "error" in reply):
            return
        if "error" in reply and not reply["error"].get("message"):
            bad.append(f"WebSocket error without a message after {seq!r:.80}")
        if reply.get("error", {}).get("type") == "server_error":
            bad.append(f"WebSocket internal error after {seq!r:.80}: {reply['error']['message']}")


CLIENT_ERRORS = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                 grpc.StatusCode.RESOURCE_EXHAUSTED}


async def grpc_calls(target: str, examples: list[tuple[str, Any]]) -> list[str]:
    bad = []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        raw = channel.unary_unary("/lyre.v1.TextToSpeech/Synthesize")
        for kind, request in examples:
            try:
                await (raw(request, timeout=TIMEOUT_S) if kind == "raw" else stub.Synthesize(request, timeout=TIMEOUT_S))
            except grpc.aio.AioRpcError as e:
                if e.code() not in CLIENT_ERRORS or not e.details():
                    bad.append(f"gRPC {e.code().name} for {request!r:.80}: {e.details()}")
    return bad


def run(http: str, grpc_target: str, examples: int, derandomize: bool = True) -> dict[str, Any]:
    """Fuzz every surface with ``examples`` examples each (WebSocket: examples / 4 sequences)."""
    rest_examples = list(zip(draw(REST_BODY, examples, derandomize), draw(REST_HEADERS, examples, derandomize),
                             strict=False))
    sequences = draw(WS_SEQUENCE, max(1, examples // 4), derandomize)
    grpc_examples = draw(GRPC_REQUEST, examples, derandomize)

    async def go():
        return await rest(http, rest_examples), await ws(http, sequences), await grpc_calls(grpc_target, grpc_examples)

    rest_bad, ws_bad, grpc_bad = asyncio.run(go())
    return {"rest": len(rest_examples), "ws_sequences": len(sequences), "grpc": len(grpc_examples),
            "violations": rest_bad + ws_bad + grpc_bad}
