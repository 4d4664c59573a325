"""SNAC directories: ``config.json`` with ``pytorch_model.bin`` or ``model.safetensors``."""

from __future__ import annotations

from pathlib import Path

import torch

from lyre.errors import CheckpointError
from lyre.model.checkpoint.llama import read_config_json


def load_snac(
    snac_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.nn.Module:
    """A SNAC model from ``config.json`` + ``pytorch_model.bin`` or ``model.safetensors``, in eval mode."""
    from snac import SNAC

    snac_dir = Path(snac_dir)
    cfg_path = snac_dir / "config.json"
    cfg = read_config_json(snac_dir, "a SNAC directory")
    try:
        model = SNAC(**cfg)
    except TypeError as e:
        raise CheckpointError(f"{cfg_path} does not describe a SNAC model: {e}") from None
    if (snac_dir / "model.safetensors").is_file():
        from safetensors.torch import load_file

        state = load_file(str(snac_dir / "model.safetensors"))
    elif (snac_dir / "pytorch_model.bin").is_file():
        state = torch.load(snac_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise CheckpointError(f"{snac_dir} holds no SNAC weights (pytorch_model.bin or model.safetensors)")
    try:
        # Old-style weight_g/weight_v keys are converted by torch's weight_norm load hook.
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{snac_dir}: weights do not match config.json: {str(e).splitlines()[0]}") from None
    return model.to(device=device, dtype=dtype).eval()
