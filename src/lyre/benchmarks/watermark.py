"""``benchmark.py --mode watermark``: how well the output watermark is found, how often unmarked
speech is flagged, and what marking costs next to the SNAC decoder.

- Detection on ``--requests`` (default 20) outputs of the configured server, as 16-bit WAV, after
  MP3 at 128 kbps, and after 8 kHz mu-law; and on the same number of real speech clips (espeak-ng)
  marked by the same watermarker.
- False positives on those speech clips unmarked.
- Cost: marking time per second of audio, against the codec's decode time per second of audio
  measured in the same run.

Real speech needs ``espeak-ng`` (Debian: ``apt-get install espeak-ng``); without it the speech rows
are skipped with a note. On the demo checkpoint the outputs are noise, which is why speech clips
are measured too.
"""

from __future__ import annotations

import asyncio
import io
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from lyre.config import LyreConfig
from lyre.model.sample_texts import TEXT_SETS

SENTENCES = [s for texts in TEXT_SETS.values() for t in texts for s in t.split(". ") if len(s) > 20]


def _int16(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, -1, 1) * 32767).round().astype(np.int16)


def mp3_128k(x: np.ndarray) -> tuple[np.ndarray, int]:
    """``x`` (24 kHz float) through MP3 at 128 kbps and back."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp3") as out:
        stream = out.add_stream("libmp3lame", rate=24000, layout="mono")
        stream.bit_rate = 128_000
        frame = av.AudioFrame.from_ndarray(_int16(x)[None], format="s16", layout="mono")
        frame.sample_rate = 24000
        out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    with av.open(io.BytesIO(buf.getvalue())) as c:
        s = c.streams.audio[0]
        return np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(s)]), s.rate


def mulaw_8k(x: np.ndarray) -> tuple[np.ndarray, int]:
    """``x`` (24 kHz float) resampled to 8 kHz, through G.711 mu-law and back (Lyre's own encoder)."""
    import av

    from lyre.audio.formats import AudioEncoder

    encoder = AudioEncoder("mulaw", 8000)
    data = encoder.encode(_int16(x)) + encoder.finish()
    codec = av.CodecContext.create("pcm_mulaw", "r")
    codec.sample_rate, codec.layout = 8000, "mono"
    return np.concatenate([f.to_ndarray().reshape(-1) for f in codec.decode(av.Packet(data))]) / 32768, 8000


def espeak_clips(n: int) -> list[np.ndarray]:
    """``n`` real speech clips at 24 kHz from espeak-ng (several voices and speeds); [] without it."""
    if shutil.which("espeak-ng") is None:
        return []
    from lyre.audio.clip import decode, to_24k

    voices = ["en-us", "en-gb", "en-us+f3", "en-gb+m3", "en-us+f5"]
    clips = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            path = Path(tmp) / f"{i}.wav"
            text = " ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(2))
            subprocess.run(["espeak-ng", "-v", voices[i % len(voices)], "-s", str(140 + 10 * (i % 5)), "-w", str(path),
                            text], check=True, capture_output=True)
            pcm, rate = decode(path.read_bytes(), 60.0)
            clips.append(to_24k(pcm, rate))
    return clips


def _rates(watermark: Any, clips: list[np.ndarray]) -> dict[str, Any]:
    paths = {"wav": lambda x: (_int16(x) / 32768, 24000), "mp3_128k": mp3_128k, "mulaw_8k": mulaw_8k}
    out: dict[str, Any] = {}
    for name, path in paths.items():
        scores = [watermark.detect(*path(x)).score for x in clips]
        out[name] = {"detected": sum(s >= watermark.threshold for s in scores), "of": len(scores),
                     "score_min": min(scores), "score_median": float(np.median(scores)), "score_max": max(scores)}
    return out


def run(cfg: LyreConfig, requests: int, progress=print) -> dict[str, Any]:
    from lyre.service.tts import TTSService

    async def outputs() -> tuple[list[np.ndarray], dict[str, Any], Any]:
        async with TTSService(cfg) as tts:
            pcm = []
            for i in range(requests):
                progress(f"output {i + 1}/{requests}")
                audio = await tts.synthesize(SENTENCES[i % len(SENTENCES)], seed=i)
                pcm.append(audio.pcm.astype(np.float32) / 32768)
            await tts.on_engine_thread(lambda: None)
            return pcm, tts.stats().codec.as_dict(), tts.watermark

    marked_outputs, codec, watermark = asyncio.run(outputs())
    result: dict[str, Any] = {"requests": requests, "threshold": watermark.threshold,
                              "outputs_marked": _rates(watermark, marked_outputs)}
    speech = espeak_clips(requests)
    if speech:
        progress(f"{len(speech)} espeak-ng speech clips")
        result["speech_marked"] = _rates(watermark, [watermark.marker()(x) for x in speech])
        result["speech_unmarked"] = _rates(watermark, speech)  # detections here are false positives
        result["speech_snr_db"] = float(np.median([10 * np.log10(np.mean(x**2) / np.mean((watermark.marker()(x) - x)**2))
                                                   for x in speech]))
    else:
        result["note"] = "espeak-ng is not installed: no real speech clips (apt-get install espeak-ng)"
    audio = np.concatenate(speech or marked_outputs)
    marker, start = watermark.marker(), time.perf_counter()
    for i in range(0, audio.size, 4096):  # as the streams mark it: chunk by chunk
        marker(audio[i:i + 4096])
    result["mark_ms_per_audio_s"] = 1000 * (time.perf_counter() - start) / (audio.size / 24000)
    per_frame = codec.get("decode_ms_per_emitted_frame")
    result["codec_ms_per_audio_s"] = per_frame * 24000 / 2048 if per_frame else None
    if result["codec_ms_per_audio_s"]:
        result["mark_cost_vs_codec"] = result["mark_ms_per_audio_s"] / result["codec_ms_per_audio_s"]
    return result


def table(result: dict[str, Any]) -> str:
    lines = [f"watermark threshold {result['threshold']}; {result['requests']} clips per row",
             f"{'clips':<28}{'wav':>14}{'mp3 128k':>14}{'mu-law 8k':>14}   (detected/of, median score)"]
    for key, label in (("outputs_marked", "Lyre outputs (marked)"), ("speech_marked", "espeak-ng speech, marked"),
                       ("speech_unmarked", "espeak-ng speech, unmarked")):
        if key in result:
            r = result[key]
            lines.append(f"{label:<28}" + "".join(f"{r[p]['detected']:>6}/{r[p]['of']:<2} {r[p]['score_median']:>5.1f}"
                                                   for p in ("wav", "mp3_128k", "mulaw_8k")))
    if "note" in result:
        lines.append(result["note"])
    if "speech_snr_db" in result:
        lines.append(f"speech to mark ratio (median): {result['speech_snr_db']:.1f} dB")
    cost = f"marking: {result['mark_ms_per_audio_s']:.2f} ms per audio second"
    if result.get("codec_ms_per_audio_s"):
        cost += (f"; the codec: {result['codec_ms_per_audio_s']:.1f} ms per audio second; marking costs "
                 f"{100 * result['mark_cost_vs_codec']:.1f}% of the codec")
    lines.append(cost)
    return "\n".join(lines)
