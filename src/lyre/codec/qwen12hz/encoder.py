"""The 12 Hz tokenizer's encoder: a reference clip's codes for reference-transcript cloning
(research §6; the reference's ``Qwen3TTSTokenizerV2Model.encode``, T:899-983).

The encoder is Kyutai's Mimi encoder as transformers implements it (``MimiModel``: SEANet
convolutions, a transformer, a stride-2 downsampling, split residual vector quantisation); Lyre
uses that implementation, without Mimi's decoder, with the weights of ``speech_tokenizer/``
(``encoder.*``). A clip of N samples at 24 kHz gives ceil(N / 1920) frames of the first 16
quantizers' codes: the frames the talker reads beside the reference transcript, and the frames
the streaming decoder is warmed with before a clone's first frame. It runs once per enrollment.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lyre.model.qwen3tts import CODE_GROUPS

DOWNSAMPLE = 1920  # samples per frame: 24 kHz at 12.5 Hz


class ReferenceEncoder:
    def __init__(self, model: Any, quantizers: int = CODE_GROUPS, downsample: int = DOWNSAMPLE):
        self.model = model
        self.quantizers, self.downsample = quantizers, downsample

    @torch.inference_mode()
    def encode(self, pcm: np.ndarray) -> np.ndarray:
        """A 24 kHz float clip -> (frames, 16) int64 codes, codebook 0 first."""
        p = next(self.model.parameters())
        x = torch.from_numpy(np.ascontiguousarray(pcm, dtype=np.float32)).to(p.device, p.dtype)[None, None]  # (1, 1, N)
        codes = self.model.encode(x, return_dict=True).audio_codes[0, : self.quantizers]  # (16, T')
        frames = math.ceil(len(pcm) / self.downsample)
        return codes[:, :frames].T.cpu().numpy().astype(np.int64)  # (frames, 16)


def encoder_config(speech_dir: str | Path) -> dict[str, Any]:
    """``encoder_config`` of ``speech_dir``/config.json; ValueError when it has none."""
    path = Path(speech_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not readable ({e})") from None
    if not isinstance(config.get("encoder_config"), dict):
        raise ValueError(f"{path} has no encoder_config: cloning from a transcript needs the 12 Hz tokenizer's "
                         "encoder (Qwen/Qwen3-TTS-Tokenizer-12Hz ships it)")
    return config


def mimi_encoder(encoder_config: dict[str, Any]) -> Any:
    """transformers' ``MimiModel`` of ``encoder_config`` without its decoder parts (random weights)."""
    from transformers import MimiConfig, MimiModel

    model = MimiModel(MimiConfig(**encoder_config))
    model.upsample = model.decoder_transformer = model.decoder = None  # (the reference's encoder keeps none)
    return model


def load_reference_encoder(speech_dir: str | Path, device: torch.device | str = "cpu") -> ReferenceEncoder:
    """The encoder of ``speech_dir`` (``speech_tokenizer/``) in float32; ValueError naming what is missing."""
    from safetensors.torch import load_file

    config = encoder_config(speech_dir)
    model = mimi_encoder(config["encoder_config"])
    weights = {k[len("encoder."):]: v for k, v in load_file(str(Path(speech_dir) / "model.safetensors")).items()
               if k.startswith("encoder.")}
    try:
        model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
    except RuntimeError as e:
        raise ValueError(f"{speech_dir}/model.safetensors: the encoder's weights do not fit its encoder_config: "
                         f"{str(e)[:300]}") from None
    quantizers = int(config.get("encoder_valid_num_quantizers", CODE_GROUPS))
    if quantizers != CODE_GROUPS:
        raise ValueError(f"{speech_dir}/config.json: encoder_valid_num_quantizers is {quantizers}; the talker reads "
                         f"{CODE_GROUPS}")
    return ReferenceEncoder(model.to(device).eval().requires_grad_(False), quantizers,
                            int(config.get("encode_downsample_rate", DOWNSAMPLE)))
