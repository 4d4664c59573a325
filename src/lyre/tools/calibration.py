"""The FP8 calibration set of the offline engine build (``build_engine.py``).

FP8 calibration uses what Orpheus really sees: the serving prompt of each built-in voice over
sample sentences, each followed by audio tokens the model itself generates for it (the PyTorch
engine, seeded and constrained), written as text that the model's tokenizer turns back into
exactly those ids (checked), because TensorRT-LLM's calibration loader reads a ``text`` column.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lyre.config import LyreConfig
from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.torch.engine import TorchEngine, TorchEngineConfig
from lyre.errors import BuildError
from lyre.model import checkpoint, orpheus
from lyre.model.sample_texts import TEXT_SETS
from lyre.service.text import MAX_SEGMENT_CHARS, split_text

CONTINUATION_TOKENS = 7 * 24  # 24 frames, ~2 s of audio after each prompt


def calibration_prompts(tokenizer: Any, voices: tuple[str, ...] | list[str], n: int) -> list[list[int]]:
    """``n`` serving prompts: the sample sentences (split as the server splits them), voices in turn."""
    segments = [s for texts in TEXT_SETS.values() for t in texts for s in split_text(t, MAX_SEGMENT_CHARS)]
    return [orpheus.build_prompt_ids(tokenizer, segments[i % len(segments)], voices[i % len(voices)])
            for i in range(n)]


def generate_continuations(
    prompts: list[list[int]], model_dir: Path, tokens: int, device: str, progress: bool = True, seed: int = 1234
) -> list[list[int]]:
    """Audio tokens the model itself generates after each prompt (PyTorch engine, batched, seeded)."""
    import torch
    from tqdm import tqdm

    dtype = torch.float16 if device == "cuda" else torch.float32
    longest = max(len(p) for p in prompts)
    engine = TorchEngine.from_checkpoint(model_dir, TorchEngineConfig(
        slots=min(32, len(prompts)), max_batch_size=min(32, len(prompts)), max_seq_len=longest + tokens + 8,
        max_prefill_tokens=2048, device=device, dtype=dtype, kv_dtype=dtype))
    out: dict[str, list[int]] = {}
    waiting = deque(GenerationRequest(f"c{i}", p, SamplingParams(max_tokens=tokens, min_tokens=tokens, seed=seed + i))
                    for i, p in enumerate(prompts))
    with tqdm(total=len(prompts) * tokens, unit="tok", desc="calibration audio", disable=not progress) as bar:
        while waiting or engine.has_work():
            while waiting and engine.add(waiting[0]):  # as slots come free
                waiting.popleft()
            for d in engine.step():
                out.setdefault(d.request_id, []).extend(d.token_ids)
                bar.update(len(d.token_ids))
    del engine
    if device == "cuda":
        torch.cuda.empty_cache()
    return [out.get(f"c{i}", []) for i in range(len(prompts))]


def records_to_text(tokenizer: Any, records: list[list[int]]) -> list[str]:
    """Each id sequence as text the tokenizer encodes back to exactly those ids (BuildError if not)."""
    texts = []
    for n, ids in enumerate(records):
        text = tokenizer.decode(ids, skip_special_tokens=False)
        back = tokenizer.encode(text, add_special_tokens=False).ids
        if back != ids:
            at = next((i for i, (a, b) in enumerate(zip(back, ids, strict=False)) if a != b), min(len(back), len(ids)))
            raise BuildError(
                f"calibration record {n} does not survive the tokenizer: token {at} is "
                f"{ids[at] if at < len(ids) else 'end'} but re-encodes as {back[at] if at < len(back) else 'end'}. "
                f"The model's tokenizer.json must name every Orpheus special and audio token"
            )
        texts.append(text)
    return texts


def write_calibration_set(
    out_dir: Path, cfg: LyreConfig, model_dir: Path, device: str, progress: bool = True,
    generate: Callable[..., list[list[int]]] = generate_continuations,
) -> dict[str, Any]:
    """Write ``out_dir/train.jsonl`` (a ``text`` column, as TensorRT-LLM's loader reads a local
    dataset directory); return what the manifest records about it."""
    tokenizer = checkpoint.load_tokenizer(model_dir)
    n = cfg.build.calibration_samples
    prompts = calibration_prompts(tokenizer, cfg.model.voices, n)
    continuations = generate(prompts, model_dir, CONTINUATION_TOKENS, device, progress)
    records = [p + c for p, c in zip(prompts, continuations, strict=True)]
    texts = records_to_text(tokenizer, records)
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "train.jsonl").open("w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    longest = max(len(r) for r in records)
    audio = sum(1 for c in continuations for t in c if orpheus.AUDIO_TOKEN_OFFSET <= t < orpheus.AUDIO_ID_END)
    return {
        "samples": n,
        "voices": list(cfg.model.voices),
        "continuation_tokens": CONTINUATION_TOKENS,
        "audio_tokens": audio,
        "max_seq_length": longest + 1,  # the loader's tokenizer adds a BOS
        "dataset": str(out_dir),
    }
