"""Host <-> device transfers of the PyTorch engine, in one place.

On a GPU, reading a value back (``.tolist()``, ``.item()``, ``bool(t)``, boolean indexing) waits
for every kernel queued before it; the engine does that once per step, for the sampled tokens
(:func:`to_host`). Everything the host already knows (slots, positions, sampling parameters,
random draws) is decided on the host and uploaded without waiting (:func:`upload`).
"""

from __future__ import annotations

from typing import Any

import torch


def upload(values: Any, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A host list (or CPU tensor) on ``device``, without waiting for the device's queue."""
    t = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    return t.to(device, non_blocking=True)


def to_host(t: torch.Tensor) -> list[Any]:
    """The one read-back of a step: waits for the device, then copies ``t`` to a list."""
    return t.tolist()
