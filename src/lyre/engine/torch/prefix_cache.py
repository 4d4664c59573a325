"""KV of prompt prefixes that many requests share, kept between requests (LRU within a byte budget).

A cloned voice's prompt starts with its reference turn: the transcript and 400-2500 audio tokens of
the reference clip, the same for every request with that voice. The PyTorch engine computes their
K/V once, keeps a copy here, and copies it into the slot of each later request with that voice,
which then prefills only its own text (TensorRT-LLM's KV block reuse does the same inside its
executor). Entries are named by the caller's key and hold the ids they were computed from; a
lookup whose ids differ is a miss, so a stale key can never serve the wrong K/V.

Owned by the engine thread (no locking).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Prefix:
    ids: tuple[int, ...]
    k: torch.Tensor  # (layers, kv_heads, n, head_dim)
    v: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


class PrefixCache:
    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self._entries: OrderedDict[str, Prefix] = OrderedDict()  # least recently used first
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def keys(self) -> list[str]:
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def holds(self, key: str, ids: Sequence[int]) -> bool:
        """Whether ``key`` is kept for exactly these ids (no effect on order or counts)."""
        entry = self._entries.get(key)
        return entry is not None and entry.ids == tuple(ids)

    def get(self, key: str, ids: Sequence[int]) -> Prefix | None:
        entry = self._entries.get(key)
        if entry is None or entry.ids != tuple(ids):
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: str, ids: Sequence[int], k: torch.Tensor, v: torch.Tensor) -> bool:
        """Keep a copy of ``k``/``v`` (layers, kv_heads, n, hd) for ``key``; evicts the least recently
        used entries to make room. False (nothing kept) when it alone exceeds the budget."""
        size = k.numel() * k.element_size() + v.numel() * v.element_size()
        if size > self.budget:
            return False
        self.drop(key)
        while self._entries and self.bytes + size > self.budget:  # room first: no copy beyond the budget
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.nbytes
            self.evictions += 1
        entry = Prefix(tuple(ids), k.clone(), v.clone())
        self._entries[key] = entry
        self.bytes += entry.nbytes
        return True

    def drop(self, key: str) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes

    def drop_prefix(self, name: str) -> int:
        """Drop every entry whose key starts with ``name``; returns how many."""
        keys = [k for k in self._entries if k.startswith(name)]
        for key in keys:
            self.drop(key)
        return len(keys)

    def stats(self) -> dict[str, float]:
        return {"prefix_cache_entries": float(len(self._entries)), "prefix_cache_bytes": float(self.bytes),
                "prefix_cache_hits": float(self.hits), "prefix_cache_misses": float(self.misses),
                "prefix_cache_evictions": float(self.evictions)}
