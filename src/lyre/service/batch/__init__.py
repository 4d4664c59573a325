"""Batch jobs: the API (:mod:`.jobs`), their input (:mod:`.inputs`), one item's synthesis
(:mod:`.render`) and the runner that claims and completes items exactly once (:mod:`.runner`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lyre.service.batch.jobs import BatchJobs
from lyre.service.batch.runner import BatchRunner
from lyre.storage.batches import BatchStore
from lyre.storage.results import open_store
from lyre.trust.audit import instance_name

__all__ = ["BatchJobs", "BatchRunner", "start"]

log = logging.getLogger("lyre.batch")


def start(tts: Any) -> BatchJobs:
    """The service's batch jobs over its database, with a runner claiming items (on the running loop)."""
    cfg = tts.config
    kv = tts.scheduler.snapshot.kv_cache  # (the engine's KV slots, as the engine thread last published them)
    if cfg.batch.enabled and cfg.scheduler.reserved_slots >= kv.used_slots + kv.free_slots:
        log.warning("batch: this server will run no batch items: they take only the KV slots beyond "
                    "scheduler.reserved_slots (%d), and its engine has %d (other servers sharing the database "
                    "still run them)", cfg.scheduler.reserved_slots, kv.used_slots + kv.free_slots)
    results = open_store(cfg.batch.results_url, Path(cfg.data_dir))
    store = BatchStore(tts.database)
    runner = BatchRunner(tts, store, results, cfg, instance_name(cfg.data_dir), tts.metrics)
    runner.start()
    return BatchJobs(tts, store, results, runner)
