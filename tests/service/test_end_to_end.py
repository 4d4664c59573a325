"""The load path end to end: default model -> prompt -> valid codes -> SNAC audio."""

from __future__ import annotations

import numpy as np
import torch

from lyre.config import load_config
from lyre.model import checkpoint, orpheus
from tests.support.paths import CONFIG_PATH, REPO_ROOT


def test_default_model_speaks_hello_world_as_whole_frames(tmp_path):
    cfg = load_config(CONFIG_PATH, {"model.demo_dir": str(REPO_ROOT / "models" / "demo")})
    resolved = checkpoint.resolve_model(cfg.model, cfg.codec, cache_dir=tmp_path / "empty-hf-cache")
    assert resolved.is_demo  # no real weights on this machine

    tokenizer = checkpoint.load_tokenizer(resolved.llama_dir)
    prompt = orpheus.build_prompt_ids(tokenizer, "Hello world", "tara")
    assert prompt[0] == orpheus.START_OF_HUMAN and prompt[-1] == orpheus.START_OF_SPEECH
    assert tokenizer.decode(prompt, skip_special_tokens=True) == "tara: Hello world"
    llama_cfg = checkpoint.read_llama_config(resolved.llama_dir)
    assert max(prompt) < llama_cfg.vocab_size

    # A few frames of valid codes (including the extremes 0 and 4095), as a generation would emit them.
    rng = np.random.default_rng(0)
    frames = 5
    c0, c1, c2 = (rng.integers(0, 4096, n * frames) for n in (1, 2, 4))
    c0[0], c2[-1] = 0, 4095
    generated = orpheus.codes_to_token_ids(c0, c1, c2) + [orpheus.END_OF_SPEECH]
    parser = orpheus.AudioTokenParser()
    parsed = parser.feed(generated)
    assert len(parsed) == frames and parser.finished
    codes = [torch.from_numpy(c)[None] for c in orpheus.frames_to_codes(parsed)]  # (1,T), (1,2T), (1,4T)

    snac = checkpoint.load_snac(resolved.snac_dir)
    with torch.inference_mode():
        audio = snac.decode(codes)  # (1, 1, samples)
    assert audio.shape == (1, 1, frames * orpheus.SAMPLES_PER_FRAME)
    assert torch.isfinite(audio).all() and audio.abs().max() <= 1.0
    assert audio.std() > 0  # the demo says something (noise), not silence
