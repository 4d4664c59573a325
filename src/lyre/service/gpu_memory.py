"""What each part of a service took of the GPU's memory as it started, logged as one line."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("lyre.service")


class GpuMemory:
    """What each part took of the GPU's memory at start (free memory before and after it, device-wide),
    logged as one line: the split between the codec and the TensorRT-LLM engine."""

    def __init__(self, free: int, total: int):
        self.total, self.start, self.last = total, free, free
        self.parts: list[tuple[str, int]] = []

    @classmethod
    def now(cls) -> GpuMemory:
        free, total = torch.cuda.mem_get_info() if torch.cuda.is_available() else (0, 0)
        return cls(free, total)

    def mark(self, part: str) -> None:
        free = torch.cuda.mem_get_info()[0] if self.total else 0
        self.parts.append((part, self.last - free))
        self.last = free

    def describe(self) -> str:
        gib = 1 << 30
        taken = "; ".join(f"{name} {used / gib:.2f} GiB" for name, used in self.parts)
        return (f"GPU memory: {self.start / gib:.2f} of {self.total / gib:.2f} GiB free at start; {taken}; "
                f"{self.last / gib:.2f} GiB left free")

    def report(self) -> None:
        if self.total:
            log.info("%s", self.describe())
