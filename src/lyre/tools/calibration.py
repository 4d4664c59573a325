"""The FP8 calibration set of the offline engine build (``build_engine.py``).

FP8 calibration sees what Orpheus sees when it serves:
- the serving prompt of each built-in voice over sample sentences, each followed by audio tokens
  the model itself generates for it (the PyTorch engine, seeded and constrained, in the
  checkpoint's dtype);
- every record the same length (the longest prompt + :data:`CONTINUATION_TOKENS`; shorter prompts
  get more audio), because TensorRT-LLM's loader pads a batch on the left and then drops the
  attention mask: padding would be calibrated on as if it were speech;
- token for token the ids Lyre sends: the loader reads a ``text`` column and tokenizes it with the
  checkpoint's tokenizer, which adds a BOS (a served prompt starts with start-of-human, its BOS
  inside). So the build hands TensorRT-LLM a staged copy of the checkpoint (links to its files)
  whose tokenizer adds nothing (:func:`stage_checkpoint`), and every record's text is checked to
  encode back to exactly its ids with that tokenizer.
"""

from __future__ import annotations

import gc
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


def checkpoint_dtype(model: str | Path, download: bool = False) -> str:
    """The checkpoint's 16-bit dtype (config.json's ``torch_dtype``): what an FP8 build calibrates and
    runs its activations in. "auto" while it is not downloaded; float32 checkpoints build bfloat16."""
    if download:
        return "auto"
    try:
        raw = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return "auto"
    dtype = raw.get("torch_dtype") or raw.get("dtype")
    return dtype if dtype in ("float16", "bfloat16") else "bfloat16"


def calibration_prompts(tokenizer: Any, voices: tuple[str, ...] | list[str], n: int) -> list[list[int]]:
    """``n`` serving prompts: the sample sentences (split as the server splits them), voices in turn."""
    segments = [s for texts in TEXT_SETS.values() for t in texts for s in split_text(t, MAX_SEGMENT_CHARS)]
    return [orpheus.build_prompt_ids(tokenizer, segments[i % len(segments)], voices[i % len(voices)])
            for i in range(n)]


def generate_continuations(
    prompts: list[list[int]], model_dir: Path, tokens: list[int], device: str, progress: bool = True, seed: int = 1234
) -> list[list[int]]:
    """``tokens[i]`` audio tokens the model itself generates after prompt ``i`` (PyTorch engine,
    batched, seeded; on a GPU in the checkpoint's dtype, as the engine will run)."""
    import torch
    from tqdm import tqdm

    dtype = getattr(torch, checkpoint_dtype(model_dir)) if device == "cuda" else torch.float32
    longest = max(len(p) + n for p, n in zip(prompts, tokens, strict=True))
    engine = TorchEngine.from_checkpoint(model_dir, TorchEngineConfig(
        slots=min(32, len(prompts)), max_batch_size=min(32, len(prompts)), max_seq_len=longest + 8,
        max_prefill_tokens=2048, device=device, dtype=dtype, kv_dtype=dtype))
    out: dict[str, list[int]] = {}
    waiting = deque(GenerationRequest(f"c{i}", p, SamplingParams(max_tokens=n, min_tokens=n, seed=seed + i))
                    for i, (p, n) in enumerate(zip(prompts, tokens, strict=True)))
    with tqdm(total=sum(tokens), unit="tok", desc="calibration audio", disable=not progress) as bar:
        while waiting or engine.has_work():
            while waiting and engine.add(waiting[0]):  # as slots come free
                waiting.popleft()
            for d in engine.step():
                out.setdefault(d.request_id, []).extend(d.token_ids)
                bar.update(len(d.token_ids))
    del engine
    gc.collect()  # (the engine's weights and KV cache, before TensorRT-LLM's builder asks for the memory)
    if device == "cuda":
        torch.cuda.empty_cache()
    return [out.get(f"c{i}", []) for i in range(len(prompts))]


STAGED_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def stage_checkpoint(model_dir: Path, out_dir: Path) -> Path:
    """``out_dir``: links to every file of ``model_dir``, except a tokenizer that adds no special
    tokens (tokenizer.json without its post-processor, tokenizer_config.json with ``add_bos_token``
    off), so that TensorRT-LLM's calibration loader tokenizes a record's text to exactly its ids."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.name not in STAGED_TOKENIZER_FILES:
            (out_dir / f.name).symlink_to(f.resolve())
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    tokenizer["post_processor"] = None
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer))
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config.update(add_bos_token=False, add_eos_token=False)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out_dir


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
    dataset directory) and the staged checkpoint ``out_dir/checkpoint`` to build from; return what
    the manifest records about them (and ``checkpoint``)."""
    tokenizer = checkpoint.load_tokenizer(model_dir)
    n = cfg.build.calibration_samples
    prompts = calibration_prompts(tokenizer, cfg.model.voices, n)
    length = max(len(p) for p in prompts) + CONTINUATION_TOKENS  # every record: no padding in a batch
    continuations = generate(prompts, model_dir, [length - len(p) for p in prompts], device, progress)
    records = [p + c for p, c in zip(prompts, continuations, strict=True)]
    short = [i for i, r in enumerate(records) if len(r) != length]
    if short:
        raise BuildError(f"calibration records {short[:5]} are not {length} tokens long: the model stopped early")
    texts = records_to_text(tokenizer, records)
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "train.jsonl").open("w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    staged = stage_checkpoint(model_dir, out_dir / "checkpoint")
    audio = sum(1 for c in continuations for t in c if orpheus.AUDIO_TOKEN_OFFSET <= t < orpheus.AUDIO_ID_END)
    return {
        "samples": n,
        "voices": list(cfg.model.voices),
        "continuation_tokens": CONTINUATION_TOKENS,
        "record_tokens": length,
        "audio_tokens": audio,
        "dtype": checkpoint_dtype(model_dir),
        "max_seq_length": length,  # the staged tokenizer adds no BOS
        "dataset": str(out_dir),
        "checkpoint": str(staged),
    }
