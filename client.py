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
import io
import json
import sys
import time
import wave
from pathlib import Path

from lyre.tools.batch_client import ClientError, add_batch_parser, error_text, run_batch

FORMATS = ("wav", "pcm", "mp3", "opus", "aac", "flac", "mulaw", "alaw")
GRPC_FORMATS = ("wav", "pcm", "mulaw", "alaw")



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
                raise ClientError(f"the server answered {resp.status}: {error_text(await resp.text())}")
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
        return run_batch(args)
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
