"""Which checkpoint serves: ``model.path`` when set, else ``model.hf_id`` when already in the local
Hugging Face cache, else the demo checkpoint (random weights: its audio is noise), said loudly."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lyre.errors import CheckpointError
from lyre.model import demo
from lyre.model.checkpoint.hub import find_cached
from lyre.model.checkpoint.llama import read_config_json

log = logging.getLogger("lyre.checkpoint")


class ModelSource(Protocol):
    """Where the Llama comes from (the config's ``model`` section)."""

    path: str | None
    hf_id: str
    revision: str
    demo_dir: str
    allow_demo: bool


class CodecSource(Protocol):
    """Where SNAC comes from (the config's ``codec`` section)."""

    path: str | None
    hf_id: str
    revision: str


@dataclass(frozen=True)
class ResolvedModel:
    llama_dir: Path  # the model's directory (Orpheus's Llama; a Qwen3-TTS checkpoint)
    snac_dir: Path  # the codec's (SNAC; a Qwen3-TTS checkpoint's speech_tokenizer/)
    is_demo: bool
    source: str  # how the Llama was found, for logs
    family: str = "orpheus"  # orpheus | qwen3-tts (the checkpoint's config.json says)


FAMILIES = {"llama": "orpheus", "qwen3_tts": "qwen3-tts"}  # config.json model_type -> model family
QWEN_DEMO_FAMILY = "qwen3-tts"  # (a demo marker naming a family: lyre checkpoint demo --family)


def checkpoint_family(model_dir: str | Path) -> str:
    """The model family of the checkpoint in ``model_dir``, read from its config.json's
    ``model_type`` (never guessed from a name); CheckpointError for another model type."""
    path = Path(model_dir) / "config.json"
    model_type = read_config_json(model_dir).get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(f"{path}: model_type {model_type!r} is not a model family Lyre serves ("
                              + ", ".join(f"{v}: {k!r}" for k, v in FAMILIES.items()) + ")")
    return FAMILIES[model_type]


def _is_family_demo(model_dir: Path) -> bool:
    try:
        return json.loads((model_dir / demo.MARKER).read_text()).get("family") == QWEN_DEMO_FAMILY
    except (OSError, ValueError):
        return False


DEMO_BANNER = """
************************************************************************************************
*  Lyre is using the DEMO checkpoint at {path}
*  Its weights are RANDOM: every sound it makes is NOISE, not speech.
*  For speech, set model.path to an Orpheus checkpoint directory or download {hf_id}
*  (`lyre checkpoint download`).
************************************************************************************************"""


def _cached(model: ModelSource, cache_dir: str | Path | None) -> Path | None:
    """``model.hf_id``'s complete copy in the local cache: an Orpheus Llama, or (model.family auto or
    qwen3-tts) a whole Qwen3-TTS checkpoint."""
    family = getattr(model, "family", "auto")
    kinds = {"orpheus": ["llama"], "qwen3-tts": ["qwen3-tts"]}.get(family, ["llama", "qwen3-tts"])
    return next((p for k in kinds if (p := find_cached(model.hf_id, k, model.revision, cache_dir)) is not None), None)


def resolve_model(
    model: ModelSource, codec: CodecSource, cache_dir: str | Path | None = None, create_demo: bool = True
) -> ResolvedModel:
    """Choose the checkpoint to serve: local path, else cached Hugging Face id, else the demo."""
    if model.path is not None:
        llama_dir, is_demo, source = Path(model.path), False, f"model.path {model.path}"
        if not llama_dir.is_dir():
            raise CheckpointError(f"model.path {model.path} does not exist or is not a directory")
        if demo.is_demo_llama(llama_dir):  # a demo of another shape (lyre checkpoint demo --shape): its SNAC is beside it
            is_demo, source = True, f"demo checkpoint {llama_dir.parent} (model.path)"
            log.warning(DEMO_BANNER.format(path=llama_dir.parent, hf_id=model.hf_id))
    elif (cached := _cached(model, cache_dir)) is not None:
        llama_dir, is_demo, source = cached, False, f"Hugging Face cache {model.hf_id}@{model.revision}"
    else:
        if not model.allow_demo:
            raise CheckpointError(
                f"no model: model.path is not set and {model.hf_id}@{model.revision} is not in the local Hugging Face "
                f"cache, and model.allow_demo is false. Set model.path or run `lyre checkpoint download`."
            )
        demo_dir = Path(model.demo_dir)
        if create_demo:
            demo.ensure_demo(demo_dir)
        elif not demo.demo_is_current(demo_dir):
            raise CheckpointError(f"the demo checkpoint at {demo_dir} is missing; run `lyre checkpoint demo {demo_dir}`")
        llama_dir, is_demo, source = demo_dir / "llama", True, f"demo checkpoint {demo_dir}"
        log.warning(DEMO_BANNER.format(path=demo_dir, hf_id=model.hf_id))

    family = checkpoint_family(llama_dir)
    wanted = getattr(model, "family", "auto")
    if wanted not in ("auto", family):
        raise CheckpointError(f"model.family is {wanted}, but the checkpoint at {llama_dir} is {family} (its "
                              f"config.json's model_type): set model.family to auto or {family}, or model.path to a "
                              f"{wanted} checkpoint")
    if family == QWEN_DEMO_FAMILY and _is_family_demo(llama_dir):
        is_demo, source = True, f"Qwen3-TTS demo checkpoint {llama_dir} (model.path)"
        log.warning(DEMO_BANNER.format(path=llama_dir, hf_id="a Qwen/Qwen3-TTS-12Hz checkpoint"))
    if codec.path is not None:
        snac_dir = Path(codec.path)
        if not snac_dir.is_dir():
            raise CheckpointError(f"codec.path {codec.path} does not exist or is not a directory")
    elif family == "qwen3-tts":  # (each Qwen3-TTS checkpoint holds its own codec)
        snac_dir = llama_dir / "speech_tokenizer"
    elif is_demo:
        snac_dir = llama_dir.parent / "snac"
    elif (cached := find_cached(codec.hf_id, "snac", codec.revision, cache_dir)) is not None:
        snac_dir = cached
    else:
        raise CheckpointError(
            f"the model is real but SNAC {codec.hf_id}@{codec.revision} is not in the local Hugging Face cache: "
            f"set codec.path or run `lyre checkpoint download`"
        )
    log.info("model: %s (%s); codec: %s", llama_dir, source, snac_dir)
    return ResolvedModel(llama_dir=llama_dir, snac_dir=snac_dir, is_demo=is_demo, source=source, family=family)
