"""Checkpoints as published: loading Llama and SNAC checkpoints (:mod:`.llama`, :mod:`.snac`),
fetching them from the Hugging Face hub (:mod:`.hub`), and choosing the one to serve
(:mod:`.resolve`). ``lyre checkpoint {demo,download,resolve}`` is their command-line face
(:mod:`lyre.tools.checkpoint`)."""

from lyre.errors import CheckpointError
from lyre.model.checkpoint.hub import (
    IGNORE_PATTERNS,
    LLAMA_PATTERNS,
    QWEN3TTS_PATTERNS,
    SNAC_PATTERNS,
    download,
    find_cached,
)
from lyre.model.checkpoint.llama import (
    INDEX_FILE,
    RANDOM_WEIGHTS,
    LlamaConfig,
    check_llama_weights,
    check_weight_shapes,
    load_llama_weights,
    load_tokenizer,
    read_config_json,
    read_llama_config,
    safetensors_files,
)
from lyre.model.checkpoint.resolve import (
    DEMO_BANNER,
    FAMILIES,
    ResolvedModel,
    checkpoint_family,
    resolve_model,
)
from lyre.model.checkpoint.snac import load_snac

__all__ = ["DEMO_BANNER", "FAMILIES", "checkpoint_family", "IGNORE_PATTERNS", "INDEX_FILE", "LLAMA_PATTERNS", "RANDOM_WEIGHTS", "QWEN3TTS_PATTERNS", "SNAC_PATTERNS", "CheckpointError",
           "LlamaConfig", "ResolvedModel", "check_llama_weights", "check_weight_shapes", "download", "find_cached",
           "load_llama_weights", "load_snac", "load_tokenizer", "read_config_json", "read_llama_config", "resolve_model",
           "safetensors_files"]
