"""The 12 Hz decoder from a Qwen3-TTS checkpoint's ``speech_tokenizer/`` directory: its config.json
(``model_type: qwen3_tts_tokenizer_12hz``, the decoder's shape under ``decoder_config``) and its
safetensors, whose ``decoder.*`` weights are the decoder's (the ``encoder.*`` ones, the Mimi
encoder that makes a cloned voice's reference codes, are not loaded here)."""

from __future__ import annotations

from pathlib import Path

import torch

from lyre.codec.qwen12hz.config import DecoderConfig
from lyre.codec.qwen12hz.decoder import Decoder
from lyre.errors import CheckpointError
from lyre.model.checkpoint import read_config_json, safetensors_files

MODEL_TYPE = "qwen3_tts_tokenizer_12hz"
PREFIX = "decoder."


def read_config(tokenizer_dir: str | Path) -> DecoderConfig:
    path = Path(tokenizer_dir) / "config.json"
    raw = read_config_json(tokenizer_dir, "a Qwen3-TTS speech tokenizer")
    if raw.get("model_type") != MODEL_TYPE:
        raise CheckpointError(f"{path} is a {raw.get('model_type')!r} model, not the 12 Hz speech tokenizer "
                              f"({MODEL_TYPE}) this decoder reads")
    cfg = DecoderConfig.from_dict(raw.get("decoder_config") or {})
    declared = raw.get("decode_upsample_rate", cfg.samples_per_frame)
    if declared != cfg.samples_per_frame:
        raise CheckpointError(f"{path}: decode_upsample_rate is {declared}, but the decoder's upsampling makes "
                              f"{cfg.samples_per_frame} samples per frame")
    return cfg


def load_decoder(tokenizer_dir: str | Path, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> Decoder:
    """The decoder of ``tokenizer_dir`` with its weights, in eval mode on ``device``; CheckpointError
    naming what is missing or does not fit."""
    from safetensors.torch import load_file

    decoder = Decoder(read_config(tokenizer_dir))
    weights = {}
    for f in safetensors_files(tokenizer_dir):
        weights.update({k[len(PREFIX):]: v for k, v in load_file(str(f)).items() if k.startswith(PREFIX)})
    expected = decoder.state_dict()
    missing = sorted(set(expected) - set(weights))
    wrong = sorted(k for k in set(expected) & set(weights) if weights[k].shape != expected[k].shape)
    if missing or wrong:
        said = [f"{len(missing)} missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"] if missing else []
        said += [f"{k} is {tuple(weights[k].shape)}, not {tuple(expected[k].shape)}" for k in wrong[:3]]
        raise CheckpointError(f"{tokenizer_dir}'s decoder weights do not fit its config: " + "; ".join(said))
    decoder.load_state_dict({k: weights[k] for k in expected})
    return decoder.to(device=device, dtype=dtype).eval()
