"""Engine fixtures: the demo model, two more model shapes, and a loop that drives an engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from lyre.model import demo, orpheus
from tests.support.engines import SHAPE_GQA4_UNTIED, SHAPE_MHA_LLAMA3, all_torch_threads


@pytest.fixture(scope="session")
def shape_dirs(tmp_path_factory, demo_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shapes")
    return {
        "demo": demo_dir / "llama",
        "gqa4-untied": demo.write_llama_checkpoint(root / "gqa4", SHAPE_GQA4_UNTIED, seed=11),
        "mha-llama3": demo.write_llama_checkpoint(root / "mha", SHAPE_MHA_LLAMA3, seed=12),
    }


@pytest.fixture(scope="session")
def eos_happy_dir(tmp_path_factory) -> Path:
    """A small Orpheus-vocabulary model whose end-of-speech logit is large: it stops often."""
    from safetensors.torch import load_file, save_file

    cfg = {**demo.DEMO_LLAMA_CONFIG, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "torch_dtype": "float32"}
    d = demo.write_llama_checkpoint(tmp_path_factory.mktemp("eos") / "m", cfg, seed=13)
    weights = load_file(str(d / "model.safetensors"))
    weights["model.embed_tokens.weight"][orpheus.END_OF_SPEECH] *= 400.0  # tied: also the lm_head row
    save_file(weights, str(d / "model.safetensors"))
    return d


@pytest.fixture(scope="module", autouse=True)
def _all_cores():
    with all_torch_threads():  # (tests/support/engines.py: why)
        yield
