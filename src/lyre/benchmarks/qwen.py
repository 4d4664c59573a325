"""``benchmark.py --mode engine --family qwen3-tts``: the Qwen3-TTS engine and 12 Hz codec against
the reference implementation, in one run on the same checkpoint and texts.

Lyre: N requests admitted together (speakers in turn, seeds 0..N-1, every request held to
``frames`` frames: end of speech is held back until then), stepped to the end; after every step
each stream's new frames are decoded by the streaming codec in one batched call, as the server's
audio pipeline does. Per N: audio seconds per wall second, first audio (a request's first frame
decoded, from the start), the code predictor's share of the step time and its cost per step.
The code predictor's batching efficiency is its cost per step at the largest N over that at N=1.

The peer: QwenLM's ``qwen_tts`` (the reference, run as its users run it): ``generate()`` on the same
N texts as one batch (its defaults: sampled at both levels, ``max_new_tokens`` = frames + 1), then
``decode()`` of every result; its first audio is the end of both (it does not stream).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from lyre.benchmarks.peer.qwen_tts import load_reference
from lyre.codec.base import StreamSettings
from lyre.codec.qwen12hz import load_decoder
from lyre.codec.qwen12hz.runtime import TwelveHzCodec
from lyre.engine.qwen3.engine import QwenEngine
from lyre.engine.torch.engine import TorchEngineConfig
from lyre.family.qwen3tts import QwenFamily
from lyre.family.qwen3tts.tokenizer import load_text_tokenizer
from lyre.model.qwen3tts import read_qwen3tts_config
from lyre.model.sample_texts import TEXT_SETS, without_tags

TEXTS = [without_tags(t) for t in TEXT_SETS["conversational"]]
SAMPLE_RATE = 24000


def run(model_dir: Path, levels: list[int], frames: int, peer: bool = True, progress=print) -> dict[str, Any]:
    family = QwenFamily(read_qwen3tts_config(model_dir))
    tokenizer = load_text_tokenizer(model_dir)
    top = max(levels)
    engine = QwenEngine.from_checkpoint(model_dir, TorchEngineConfig(slots=top, max_batch_size=top,
                                                                     max_seq_len=frames + 256))
    decoder = load_decoder(model_dir / "speech_tokenizer").requires_grad_(False)
    cp_calls: list[tuple[int, float]] = []  # (rows, seconds) of each code-predictor call
    predict = engine.sampler.predict

    def timed(seqs, hidden, c0):
        t0 = time.perf_counter()
        out = predict(seqs, hidden, c0)
        cp_calls.append((len(seqs), time.perf_counter() - t0))
        return out

    engine.sampler.predict = timed
    _lyre_level(engine, family, tokenizer, TwelveHzCodec(decoder), 1, 4)  # warm-up
    result: dict[str, Any] = {"frames": frames, "levels": []}
    for n in levels:
        progress(f"qwen3-tts engine: {n} streams ...")
        cp_calls.clear()
        level = _lyre_level(engine, family, tokenizer, TwelveHzCodec(decoder), n, frames)
        level["cp_s_per_step"] = sum(s for _, s in cp_calls) / max(1, len(cp_calls))
        level["cp_share"] = sum(s for _, s in cp_calls) / level["engine_s"]
        if peer:
            progress(f"qwen_tts reference: {n} texts ...")
            level["peer"] = _peer_level(model_dir, n, frames)
        result["levels"].append(level)
    first = result["levels"][0]["cp_s_per_step"]
    result["cp_batching"] = result["levels"][-1]["cp_s_per_step"] / first if first else None
    return result


def _lyre_level(engine: QwenEngine, family: QwenFamily, tokenizer: Any, codec: TwelveHzCodec, n: int,
                frames: int) -> dict[str, Any]:
    voices = family.voices
    settings = StreamSettings(first_flush_frames=1, max_chunk_frames=frames)
    streams = {}
    t0 = time.perf_counter()
    for i in range(n):
        prompt = family.prompt(tokenizer, TEXTS[i % len(TEXTS)], voices[i % len(voices)])
        sampling = family.sampling(None, {"seed": i, "max_tokens": frames, "min_tokens": frames})
        request = family.request(f"q{i}", prompt, sampling)
        if not engine.add(request):
            raise RuntimeError("the engine has fewer slots than streams")
        streams[request.request_id] = codec.new_stream(settings)
    parsers = {rid: family.new_parser() for rid in streams}
    first_audio: dict[str, float] = {}
    samples, engine_s = 0, 0.0
    while engine.has_work():
        t = time.perf_counter()
        deltas = engine.step()
        engine_s += time.perf_counter() - t
        for d in deltas:
            streams[d.request_id].push(parsers[d.request_id].feed(d.token_ids))
            if d.finished:
                streams[d.request_id].finish()
        jobs = [job for s in streams.values() if (job := s.plan(1, need_audio=True)) is not None]
        for job, res in zip(jobs, codec.decode(jobs), strict=True):
            rid = next(r for r, s in streams.items() if s is job.stream)
            samples += len(job.stream.complete(job, res))
            first_audio.setdefault(rid, time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    firsts = sorted(first_audio.values())
    return {"streams": n, "audio_s_per_wall_s": samples / SAMPLE_RATE / wall, "wall_s": wall, "engine_s": engine_s,
            "first_audio_ms_p50": 1000 * firsts[len(firsts) // 2], "first_audio_ms_max": 1000 * firsts[-1]}


def _peer_level(model_dir: Path, n: int, frames: int) -> dict[str, Any]:
    reference, decoder, tok = _reference(model_dir)
    ids = [torch.tensor([tok.encode(f"<|im_start|>assistant\n{TEXTS[i % len(TEXTS)]}<|im_end|>\n"
                                    f"<|im_start|>assistant\n").ids]) for i in range(n)]
    speakers = list(read_qwen3tts_config(model_dir).speakers)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.inference_mode():
        codes, _ = reference.generate(input_ids=ids, languages=["auto"] * n,
                                      speakers=[speakers[i % len(speakers)] for i in range(n)],
                                      max_new_tokens=frames + 1)
        audio = [decoder(c.T[None]) for c in codes]  # (its own decode: one full decode per result)
    wall = time.perf_counter() - t0
    samples = sum(a.shape[-1] for a in audio)
    return {"audio_s_per_wall_s": samples / SAMPLE_RATE / wall, "wall_s": wall, "first_audio_ms": 1000 * wall,
            "frames": [int(c.shape[0]) for c in codes]}


_REFERENCES: dict[Path, Any] = {}


def _reference(model_dir: Path) -> Any:
    """The reference model, decoder and text tokenizer of ``model_dir`` (loaded once per run)."""
    if model_dir not in _REFERENCES:
        _REFERENCES[model_dir] = (*load_reference(model_dir), load_text_tokenizer(model_dir))
    return _REFERENCES[model_dir]


def table(result: dict[str, Any]) -> str:
    lines = [f"Qwen3-TTS, {result['frames']} frames a stream ({result['frames'] * 0.08:.1f} s of audio)",
             f"{'streams':>8}{'audio s/wall s':>16}{'first audio p50 ms':>20}{'CP share':>10}{'CP ms/step':>12}"
             f"{'peer audio s/wall s':>21}{'peer first audio ms':>21}{'ratio':>7}"]
    for lv in result["levels"]:
        peer = lv.get("peer")
        ratio = f"{lv['audio_s_per_wall_s'] / peer['audio_s_per_wall_s']:.1f}x" if peer else "-"
        lines.append(f"{lv['streams']:>8}{lv['audio_s_per_wall_s']:>16.2f}{lv['first_audio_ms_p50']:>20.0f}"
                     f"{lv['cp_share']:>10.0%}{1000 * lv['cp_s_per_step']:>12.1f}"
                     f"{peer['audio_s_per_wall_s'] if peer else float('nan'):>21.2f}"
                     f"{peer['first_audio_ms'] if peer else float('nan'):>21.0f}{ratio:>7}")
    if result.get("cp_batching") is not None:
        lines.append(f"code predictor cost per step at {result['levels'][-1]['streams']} streams / at "
                     f"{result['levels'][0]['streams']}: {result['cp_batching']:.2f} (goal <= 3)")
    return "\n".join(lines)
