"""Which checkpoint serves: ``model.path`` when set, else ``model.hf_id`` when already in the local
Hugging Face cache, else the demo checkpoint (random weights: its audio is noise), said loudly."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lyre.errors import CheckpointError
from lyre.model import demo
from lyre.model.checkpoint.hub import find_cached

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
    llama_dir: Path
    snac_dir: Path
    is_demo: bool
    source: str  # how the Llama was found, for logs


DEMO_BANNER = """
************************************************************************************************
*  Lyre is using the DEMO checkpoint at {path}
*  Its weights are RANDOM: every sound it makes is NOISE, not speech.
*  For speech, set model.path to an Orpheus checkpoint directory or download {hf_id}
*  (`lyre checkpoint download`).
************************************************************************************************"""


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
    elif (cached := find_cached(model.hf_id, "llama", model.revision, cache_dir)) is not None:
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

    if codec.path is not None:
        snac_dir = Path(codec.path)
        if not snac_dir.is_dir():
            raise CheckpointError(f"codec.path {codec.path} does not exist or is not a directory")
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
    return ResolvedModel(llama_dir=llama_dir, snac_dir=snac_dir, is_demo=is_demo, source=source)
