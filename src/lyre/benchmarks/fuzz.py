"""Fuzzing a running server with hypothesis: REST bodies and headers, WebSocket message sequences,
gRPC messages (and raw bytes). Every answer must be a success or a clear client error: never a
5xx, an INTERNAL/UNKNOWN status, a hang, or a socket closed without an error frame.

A fixed corpus (the inputs hostile runs found answered wrongly) goes first, each with the answer
it must get (its status, or its error code on a WebSocket), then examples drawn by hypothesis
(``derandomize`` for a repeatable run), in order.
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
from riva.client.proto import riva_tts_pb2, riva_tts_pb2_grpc

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


# The inputs that hostile runs found answered wrongly (issue 25), sent first on every run, on every
# surface they fit: text spelling a control token (whole, and split across two messages), sampling
# that would leave no candidate, impossible token counts, encoded and doubly authorised bodies,
# malformed multipart, a later streaming message that changes the call's settings.
CONTROL_TEXTS = ("Say <|eot_id|> now.", "<custom_token_5>", "x<|begin_of_text|>", "Hi <|start_header_id|> x")
BAD_SAMPLING = ({"top_p": 1e-45}, {"top_p": 1e-300}, {"top_p": 0}, {"temperature": 1e-30},
                {"min_tokens": 20, "max_tokens": 10}, {"max_tokens": 100000})
SPEECH = "/v1/audio/speech"
_PART = b'--X\r\nContent-Disposition: form-data; name="audio"; filename="a.wav"\r\n\r\nRIFF\r\n--X--\r\n'
_SAMPLING_REFUSED = {400, 422}
_INVALID = {grpc.StatusCode.INVALID_ARGUMENT}
# (path, body, headers, the statuses it must get)
REST_CORPUS: list[tuple[str, Any, Any, set[int]]] = [
    *[(SPEECH, {"input": text, "voice": "tara"}, {}, {400}) for text in CONTROL_TEXTS],
    *[(SPEECH, {"input": "Hello there.", **bad}, {}, _SAMPLING_REFUSED) for bad in BAD_SAMPLING],
    (SPEECH, {"input": None}, {}, {400}),
    *[(SPEECH, {"input": "Hello there."}, {"Content-Encoding": enc}, {415}) for enc in ("gzip", "deflate", "br",
                                                                                         "x-unknown")],
    (SPEECH, {"input": "Hello there."}, [("Authorization", "Bearer a"), ("Authorization", "Bearer b")], {400}),
    *[(path, body, {"Content-Type": "multipart/form-data; boundary=X"}, {400})
      for path in ("/v1/audio/verify", "/v1/voices")
      for body in (_PART.replace(b"Content-Disposition", b"Content-Disposition\x00"),
                   _PART.replace(b"\r\n\r\n", b"\r\n"), b"--X\r\n" + b"A: b\r\n" * 200, b"--X--garbage", _PART[:30])],
]
# (messages, the error codes one of which the sequence must be answered with)
WS_CORPUS: list[tuple[list[Any], set[str]]] = [
    *[([{"context_id": "c", "append": text, "voice": "tara"}, {"context_id": "c", "end": True}], {"control_token"})
      for text in CONTROL_TEXTS],
    ([{"context_id": "c", "append": "Hi <|eot"}, {"context_id": "c", "append": "_id|> you."},
      {"context_id": "c", "end": True}], {"control_token"}),
    *[([{"text": "Hello there.", **bad}], {"invalid_request", "out_of_range"}) for bad in BAD_SAMPLING],
]
# (kind, request, the status codes it must end with): kind "message", or "two-keys" (sent with two
# authorization metadata entries)
GRPC_CORPUS: list[tuple[str, Any, set[grpc.StatusCode]]] = [
    *[("message", tts_pb2.SynthesizeRequest(text=text), _INVALID) for text in CONTROL_TEXTS],
    *[("message", tts_pb2.SynthesizeRequest(text="Hello there.", sampling=tts_pb2.SamplingOptions(**bad)), _INVALID)
      for bad in BAD_SAMPLING if "min_tokens" not in bad],
    ("two-keys", tts_pb2.SynthesizeRequest(text="Hello there."), {grpc.StatusCode.UNAUTHENTICATED}),
]
TWO_KEYS = (("authorization", "Bearer a"), ("authorization", "Bearer b"))


def _riva(text: str, **fields: Any) -> Any:
    return riva_tts_pb2.SynthesizeSpeechRequest(text=text, **{"sample_rate_hz": 8000, **fields})


def _config() -> Any:
    return tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.StreamingConfig(voice="tara"))


def _text(text: str) -> Any:
    return tts_pb2.StreamingSynthesizeRequest(text=text)


# (method, messages, the status codes it must end with): streaming calls whose later messages must
# be checked like the first
STREAM_CORPUS: list[tuple[str, list[Any], set[grpc.StatusCode]]] = [
    *[("StreamingSynthesize", [_config(), _text("Fine so far. "), _text(text)], _INVALID) for text in CONTROL_TEXTS],
    ("StreamingSynthesize", [_config(), _text("Hi <|eot"), _text("_id|> you.")], _INVALID),
    ("StreamingSynthesize", [_config(), _config()], _INVALID),
    *[("SynthesizeOnline", [_riva("First."), _riva(text)], _INVALID) for text in CONTROL_TEXTS],
    ("SynthesizeOnline", [_riva("First.", voice_name="tara"), _riva("Next.", voice_name="leo")], _INVALID),
    ("SynthesizeOnline", [_riva("First."), _riva("Next.", encoding=7)], _INVALID),
    ("SynthesizeOnline", [_riva("First."), _riva("Next.", voice_name="v_0123456789abcdef")],
     {grpc.StatusCode.NOT_FOUND}),  # (another account's voice is no voice at all to this one)
    ("SynthesizeOnline", [_riva("First."), _riva("Next.", custom_configuration={"top_p": "1e-45"})], _INVALID),
]


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


def _with_json_type(headers: Any) -> Any:
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers)
    if any(name.lower() == "content-type" for name, _ in pairs):
        return headers
    return [*pairs, ("Content-Type", "application/json")]


async def rest(http: str, examples: list[tuple[str, Any, Any, set[int] | None]]) -> list[str]:
    """(path, body, headers, expected statuses or None) posted. Violations: 5xx, a status other than
    the one expected, a non-JSON error, a 200 without audio, a hang."""
    bad = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as s:
        for path, body, headers, expect in examples:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            if not isinstance(body, bytes):  # JSON says so (unless the example's own headers say otherwise)
                headers = _with_json_type(headers)
            try:
                async with s.post(http + path, data=data, headers=headers) as r:
                    payload = await r.read()
                    if expect is not None and r.status not in expect:
                        bad.append(f"REST {r.status} (expected {sorted(expect)}) for {body!r:.80}: {payload[:200]!r}")
                    elif r.status >= 500:
                        bad.append(f"REST {r.status} for {body!r:.80}: {payload[:200]!r}")
                    elif r.status == 200 and not payload and path == SPEECH:
                        bad.append(f"REST 200 without audio for {body!r:.80}")
                    elif r.status != 200 and not json.loads(payload)["error"]["message"]:
                        bad.append(f"REST {r.status} without a message for {body!r:.80}")
            except asyncio.TimeoutError:
                bad.append(f"REST hang for {body!r:.80}")
    return bad


async def ws(http: str, sequences: list[tuple[list[Any], set[str] | None]]) -> list[str]:
    """Each sequence (and the error codes one of which must answer it, or None) on its own socket,
    then a probe: the socket must still answer it."""
    bad = []
    url = http.replace("http://", "ws://") + "/v1/audio/stream"
    for seq, expect in sequences:
        try:
            async with websockets.connect(url, max_size=None) as sock:
                for message in seq:
                    await sock.send(message if isinstance(message, (str, bytes)) else json.dumps(message))
                await sock.send(json.dumps({"context_id": "probe", "text": "Still there?", "max_tokens": 14}))
                codes = await asyncio.wait_for(_until_probe(sock, seq, bad), TIMEOUT_S)
                if expect is not None and not codes & expect:
                    bad.append(f"WebSocket answered {sorted(codes)} (expected one of {sorted(expect)}) to {seq!r:.80}")
        except websockets.ConnectionClosed as e:
            bad.append(f"WebSocket closed ({e}) after {seq!r:.80}")
        except asyncio.TimeoutError:
            bad.append(f"WebSocket hang after {seq!r:.80}")
    return bad


async def _until_probe(sock, seq: list[Any], bad: list[str]) -> set[str]:
    """Read replies until the probe's answer; note error frames that are not clear client errors.
    The error codes of the replies before it."""
    codes = set()
    while True:
        raw = await sock.recv()
        reply = json.loads(raw) if isinstance(raw, str) else {}
        if reply.get("context_id") == "probe" and ("done" in reply or "error" in reply):
            return codes
        if "error" in reply:
            codes.add(reply["error"].get("code"))
            if not reply["error"].get("message"):
                bad.append(f"WebSocket error without a message after {seq!r:.80}")
            if reply["error"].get("type") == "server_error":
                bad.append(f"WebSocket internal error after {seq!r:.80}: {reply['error']['message']}")


CLIENT_ERRORS = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                 grpc.StatusCode.RESOURCE_EXHAUSTED}


def _grpc_refusal(what: str, e: grpc.aio.AioRpcError, expect: set[grpc.StatusCode] | None) -> str | None:
    """Why a call's end is wrong: a status other than the one expected, or one that is no clear
    client error (never a bare CANCELLED, never INTERNAL/UNKNOWN), or no message; None if right."""
    if expect is not None and e.code() not in expect:
        return f"gRPC {e.code().name} (expected {sorted(c.name for c in expect)}) for {what:.120}: {e.details()}"
    if e.code() not in CLIENT_ERRORS | (expect or set()) or not e.details():
        return f"gRPC {e.code().name} for {what:.120}: {e.details()}"
    return None


async def grpc_streams(target: str, cases: list[tuple[str, list[Any], set[grpc.StatusCode]]]) -> list[str]:
    """Streaming calls: each must end with its expected status, whichever message was the bad one."""
    bad = []
    async with grpc.aio.insecure_channel(target) as channel:
        calls = {"StreamingSynthesize": tts_pb2_grpc.TextToSpeechStub(channel).StreamingSynthesize,
                 "SynthesizeOnline": riva_tts_pb2_grpc.RivaSpeechSynthesisStub(channel).SynthesizeOnline}
        for method, messages, expect in cases:
            try:
                async for _ in calls[method](iter(messages), timeout=TIMEOUT_S):
                    pass
                if grpc.StatusCode.OK not in expect:
                    bad.append(f"gRPC {method} OK (expected {sorted(c.name for c in expect)}) for {messages!r:.120}")
            except grpc.aio.AioRpcError as e:
                if (why := _grpc_refusal(f"{method} {messages!r}", e, expect)) is not None:
                    bad.append(why)
    return bad


async def grpc_calls(target: str, examples: list[tuple[str, Any, set[grpc.StatusCode] | None]]) -> list[str]:
    """(kind, request, expected statuses or None): "message", "raw" bytes, or "two-keys" (a message
    sent with two authorization entries)."""
    bad = []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        raw = channel.unary_unary("/lyre.v1.TextToSpeech/Synthesize")
        for kind, request, expect in examples:
            try:
                if kind == "raw":
                    await raw(request, timeout=TIMEOUT_S)
                else:
                    await stub.Synthesize(request, timeout=TIMEOUT_S, metadata=TWO_KEYS if kind == "two-keys" else None)
                if expect is not None and grpc.StatusCode.OK not in expect:
                    bad.append(f"gRPC OK (expected {sorted(c.name for c in expect)}) for {request!r:.80}")
            except grpc.aio.AioRpcError as e:
                if (why := _grpc_refusal(repr(request), e, expect)) is not None:
                    bad.append(why)
    return bad


def run(http: str, grpc_target: str, examples: int, derandomize: bool = True) -> dict[str, Any]:
    """Fuzz every surface with ``examples`` examples each (WebSocket: examples / 4 sequences)."""
    rest_examples = REST_CORPUS + [(SPEECH, body, headers, None) for body, headers in zip(
        draw(REST_BODY, examples, derandomize), draw(REST_HEADERS, examples, derandomize), strict=False)]
    sequences = WS_CORPUS + [(seq, None) for seq in draw(WS_SEQUENCE, max(1, examples // 4), derandomize)]
    grpc_examples = GRPC_CORPUS + [(kind, request, None) for kind, request in draw(GRPC_REQUEST, examples, derandomize)]

    async def go():
        return (await rest(http, rest_examples), await ws(http, sequences), await grpc_calls(grpc_target, grpc_examples),
                await grpc_streams(grpc_target, STREAM_CORPUS))

    rest_bad, ws_bad, grpc_bad, stream_bad = asyncio.run(go())
    corpus = len(REST_CORPUS) + len(WS_CORPUS) + len(GRPC_CORPUS) + len(STREAM_CORPUS)
    return {"rest": len(rest_examples), "ws_sequences": len(sequences), "grpc": len(grpc_examples),
            "grpc_streams": len(STREAM_CORPUS), "corpus": corpus, "violations": rest_bad + ws_bad + grpc_bad + stream_bad}
