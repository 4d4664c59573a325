"""Voices for the load benchmarks: ``--voice tara,clone`` measures each voice in turn on the same
server; ``clone`` enrolls a reference clip first (``--clone-audio FILE --clone-transcript TEXT``,
or a generated 8 s clip: the demo checkpoint makes noise of any voice alike) and loads its id."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

CLONE = "clone"
GENERATED_TRANSCRIPT = "This is the reference recording of the benchmark's cloned voice, eight seconds long."


def generated_clip(seconds: float = 8.0, rate: int = 24000) -> bytes:
    """A speech-like WAV (a voiced source with a moving pitch and syllable-rate loudness)."""
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * np.cumsum(160 + 50 * np.sin(2 * np.pi * 0.7 * t)) / rate
    voiced = sum(np.sin(h * phase) / h for h in range(1, 12))
    x = 0.15 * voiced * np.clip(np.sin(2 * np.pi * 4 * t), 0, None) ** 0.5
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def voices(args: Any, http: str) -> list[tuple[str, str | None]]:
    """(label, voice to request) for each ``--voice`` entry; ``clone`` enrolls on ``http`` first."""
    names = [v.strip() for v in (args.voice or "").split(",") if v.strip()] or [None]
    return [(CLONE, enroll(args, http)) if name == CLONE else (name or "default", name) for name in names]


def enroll(args: Any, http: str) -> str:
    audio = Path(args.clone_audio).read_bytes() if args.clone_audio else generated_clip()
    transcript = args.clone_transcript or GENERATED_TRANSCRIPT

    async def go() -> str:
        import aiohttp

        form = aiohttp.FormData(default_to_multipart=True)
        form.add_field("audio", audio, filename="reference.wav")
        form.add_field("transcript", transcript)
        form.add_field("name", f"benchmark-{np.random.default_rng().integers(1 << 30)}")
        form.add_field("consent", json.dumps({"granted": True, "speaker": "the benchmark",
                                              "source": "self_recorded", "statement": "benchmark.py --voice clone"}))
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        async with aiohttp.ClientSession(headers=headers) as s, s.post(http + "/v1/voices", data=form) as r:
            body = await r.json()
            if r.status != 201:
                raise RuntimeError(f"enrolling the benchmark's cloned voice failed: HTTP {r.status}: "
                                   f"{body.get('error', {}).get('message')}")
            return body["id"]

    return asyncio.run(go())
