"""Host <-> device transfers of the PyTorch engine, in one place.

On a GPU, reading a value back (``.tolist()``, ``.item()``, ``bool(t)``, boolean indexing) waits
for every kernel queued before it; the engine does that once per step, for the sampled tokens
(:func:`to_host`). Everything the host already knows (slots, positions, sampling parameters,
random draws) is decided on the host and uploaded without waiting (:func:`upload`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def upload(values: Any, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A host list (or CPU tensor) on ``device``, without waiting for the device's queue."""
    t = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    return t.to(device, non_blocking=True)


def to_host(t: torch.Tensor) -> list[Any]:
    """The one read-back of a step: waits for the device, then copies ``t`` to a list."""
    return t.tolist()


class Staging:
    """A static input on the device (a CUDA graph reads its address) and the pinned host buffer each
    step's values are laid out in, sent in one asynchronous copy. The host buffer is handed out again
    only once the last copy out of it has left (waited on an event, which the step's read-back has
    normally passed already)."""

    def __init__(self, rows: int, cols: int, device: torch.device):
        self.device = device
        self.inputs = torch.zeros(rows, cols, dtype=torch.long, device=device)
        self._host = torch.zeros(rows, cols, dtype=torch.long, pin_memory=device.type == "cuda")
        self._copied: torch.cuda.Event | None = None

    def host(self) -> np.ndarray:
        """The host buffer to fill (rows, cols), free to write."""
        if self._copied is not None:
            self._copied.synchronize()
        return self._host.numpy()

    def send(self) -> torch.Tensor:
        """The host buffer's values onto the device (not waited for); the device buffer."""
        self.inputs.copy_(self._host, non_blocking=True)
        if self.inputs.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()
        return self.inputs
