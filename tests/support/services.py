"""The library service on the demo checkpoint, and a look at its engine thread's state.

Every service the tests start shares :data:`SHARED`: the demo's tokenizer, SNAC and codec graphs
are loaded and warmed up once per run (each service still has its own engine, KV cache, codec
streams, database and engine thread)."""

from __future__ import annotations

import asyncio
import tempfile

from lyre.model import orpheus
from lyre.service import runtime
from lyre.service.tts import TTSService
from tests.support.narrow_codec import narrow_codec
from tests.support.paths import CONFIG_PATH, REPO_ROOT

F = orpheus.SAMPLES_PER_FRAME
DEMO = str(REPO_ROOT / "models" / "demo")
SHARED = runtime.Shared()


def service(**overrides) -> TTSService:
    """The demo service (with the tests' narrow SNAC: tests/support/narrow_codec.py); utterances are exactly max_tokens long (min_tokens holds back the stop)."""
    base = {"model.demo_dir": DEMO, "codec.path": str(narrow_codec()), "codec.noise": False, "sampling.max_tokens": 42,
            "scheduler.max_concurrent_sessions": 8, "scheduler.max_batch_size": 8, "kv_cache.max_seq_len": 512,
            "data_dir": tempfile.mkdtemp(prefix="lyre-data-")}  # its own voices database
    merged = {**base, **overrides}
    merged.setdefault("sampling.min_tokens", merged["sampling.max_tokens"])
    return TTSService.from_config(CONFIG_PATH, shared=SHARED, **merged)


async def engine_state(tts: TTSService) -> dict:
    """The engine thread's state after one more step (so messages posted before, e.g. cancels, are in)."""
    await tts.on_engine_thread(lambda: None)  # the engine steps between this message and the probe

    def probe():
        sch = tts.scheduler
        return {"active": len(sch.active), "pending": len(sch.pending), "requests": len(sch._by_request),
                "engine_active": sch.engine.stats().active, "engine_ids": len(sch.engine.slots.by_id),
                "free_slots": sch.engine.slots.free, "gate": tts.gate.inside,
                "codec_states": len(sch.audio.codec.live)}

    return await tts.on_engine_thread(probe)


def run(coro):
    return asyncio.run(coro)
