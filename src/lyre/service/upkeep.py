"""The service's background work on its event loop: the heartbeat that tells the engine thread the
loop is on time, and the sweep that drops kept prefixes of voices deleted by another replica."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from lyre.core.scheduler import Scheduler
from lyre.service.voices import Voices
from lyre.storage.registry import ID_PATTERN

KeptPrefixes = Callable[[], Awaitable[list[str]]]  # the engine's kept prefixes' keys, asked on its thread

log = logging.getLogger("lyre.service")

BEAT_S = 0.1  # how often the event loop says it is on time


async def heartbeat(scheduler: Scheduler) -> None:
    """Tell the engine thread, every BEAT_S, that this event loop (which writes audio to the
    clients) is on time: while it is late, listeners' clocks pause (``Scheduler.loop_beat``)."""
    while True:
        scheduler.loop_beat = time.monotonic()
        await asyncio.sleep(BEAT_S)


async def sweep_deleted_voices(voices: Voices, kept: KeptPrefixes) -> None:
    """Every ``voices.sweep_s``: :func:`sweep_once`."""
    while True:
        await asyncio.sleep(voices.config.voices.sweep_s)
        try:
            await sweep_once(voices, kept)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the database is away: try again next time
            log.warning("could not check kept prefixes against the voices database: %s", e)


async def sweep_once(voices: Voices, kept: KeptPrefixes) -> None:
    """What is kept of voices deleted elsewhere (another replica sharing the database: their kept
    prefixes, codec states and reference prompts) is dropped here too. (A deletion through this
    process drops it at once.)"""
    # (a cloned voice's prefixes are named by its id; a built-in voice's, "rows:...", by their rows)
    ids = {name for key in await kept() if ID_PATTERN.fullmatch(name := key.split(":", 1)[0])}
    if ids:
        for gone in ids - await asyncio.to_thread(voices.registry.existing, ids):
            log.info("voice %s was deleted elsewhere: its kept prefix is dropped", gone)
            voices.forget(gone)
