"""SNAC's decoder noise: switched off, or drawn from a seeded generator."""

from __future__ import annotations

import torch
from torch import nn


class SeededNoise(nn.Module):
    """SNAC's NoiseBlock with its noise drawn from a dedicated generator."""

    def __init__(self, block: nn.Module, generator: torch.Generator):
        super().__init__()
        self.linear = block.linear
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, t = x.shape
        noise = torch.randn((b, 1, t), generator=self.generator, device="cpu", dtype=torch.float32)
        return x + noise.to(device=x.device, dtype=x.dtype) * self.linear(x)


def configure_noise(snac: nn.Module, enabled: bool, seed: int | None = None) -> nn.Module:
    """Switch SNAC's decoder noise off, or draw it from a generator seeded with ``seed``."""
    from snac.layers import NoiseBlock

    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    for module in list(snac.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, (NoiseBlock, SeededNoise)):
                if not enabled:
                    replacement = nn.Identity()
                elif generator is not None:
                    replacement = SeededNoise(child, generator)
                else:
                    continue
                setattr(module, child_name, replacement)
    return snac
