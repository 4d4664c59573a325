"""Kept prefixes in the slots: a request whose prompt starts with a kept prefix (a cloned voice's
reference turn) gets its K/V copied into its slot at admission and prefills only the rest; once a
request's prefill has passed a prefix not kept yet, a copy of its K/V is kept
(:class:`~lyre.engine.torch.prefix_cache.PrefixCache` decides what stays). Owned by the engine thread."""

from __future__ import annotations

import logging

from lyre.engine.torch.llama import KVCache
from lyre.engine.torch.prefix_cache import PrefixCache
from lyre.engine.torch.sequence import Sequence

log = logging.getLogger("lyre.engine")


class KeptPrefixes:
    def __init__(self, prefixes: PrefixCache, cache: KVCache):
        self.prefixes, self.cache = prefixes, cache
        self._forgotten: set[str] = set()  # prefix names never to keep again (deleted voices)

    @staticmethod
    def _shared(seq: Sequence) -> bool:
        r = seq.request
        return bool(r.prefix_key) and 0 < r.prefix_len < r.prompt_len

    def reuse(self, seq: Sequence) -> None:
        """A kept prefix's K/V into ``seq``'s slot: its prefill starts after the prefix."""
        r = seq.request
        if not self._shared(seq):
            return
        entry = self.prefixes.get(r.prefix_key, r.prefix_ids)
        if entry is not None:
            self.cache.load(seq.slot, entry.k, entry.v)
            seq.num_cached = r.prefix_len
            seq.prefix_kept = True

    def keep(self, seq: Sequence) -> None:
        """Once ``seq``'s prefill has passed its prefix, keep a copy of the prefix's K/V."""
        r = seq.request
        if seq.prefix_kept or not self._shared(seq) or seq.num_cached < r.prefix_len:
            return
        seq.prefix_kept = True
        if any(r.prefix_key.startswith(name) for name in self._forgotten):
            return  # admitted before its voice was deleted: it finishes, its prefix is not kept
        ids = r.prefix_ids
        if not self.prefixes.holds(r.prefix_key, ids):  # (a stale entry under this key is replaced)
            try:
                self.prefixes.put(r.prefix_key, ids, *self.cache.prefix(seq.slot, r.prefix_len))
            except Exception as e:  # noqa: BLE001 - (out of memory for the copy): a kept prefix only saves work
                log.warning("prefix %s not kept: %s: %s", r.prefix_key, type(e).__name__, e)

    def keys(self) -> list[str]:
        return self.prefixes.keys()

    def forget(self, name: str) -> None:
        """Drop every kept prefix named ``name``..., and never keep one again."""
        self.prefixes.drop_prefix(name)
        self._forgotten.add(name)
