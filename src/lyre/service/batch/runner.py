"""The batch runner: one asyncio task per server that claims items, renders them and publishes their audio.

Exactly once, across crashes and replicas:

1. an item is claimed with a lease in the database (:class:`~lyre.storage.batches.BatchStore`);
   a heartbeat renews the leases of the items this server runs every ``lease_s / 3``;
2. its audio is written to a temporary file, then published under a key of its own attempt
   (``<batch>/<line>-<attempt>.<format>``): a reader sees a whole file or none;
3. the item is completed in one conditional UPDATE that holds only while this server's lease is the
   current one. Losing the lease (a stall longer than ``lease_s``) means the result is deleted, not shown;
   a crash between 2 and 3 leaves a file no row points to, removed when the item is next completed.

A server that starts again queues at once what its earlier run left running; another server takes a
dead one's items when their leases run out. Items of accounts are claimed in turn, each account
to at most its ``batch_slots`` here. A transient failure (the database, the results store, this
server stopping) gives the item back; a failure of the item itself (its voice deleted meanwhile, the
engine refusing it) fails it alone, with its reason in the error file.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from lyre.config import LyreConfig
from lyre.core.session import CANCELLED, FINISHED
from lyre.errors import DatabaseError, LyreError, ServiceUnavailable
from lyre.service.batch.render import render
from lyre.storage.batches import BatchStore, Claim
from lyre.storage.results import ResultStore

log = logging.getLogger("lyre.batch")

BACKOFF_S = 5.0  # after a transient failure (the database, the store), before claiming again


class BatchRunner:
    def __init__(self, tts: Any, store: BatchStore, results: ResultStore, config: LyreConfig, instance: str,
                 metrics: Any = None):
        self.tts, self.store, self.results, self.metrics = tts, store, results, metrics
        self.cfg = config.batch
        self.instance = instance  # this server among those sharing the database (stable across restarts)
        self.server = f"{instance}/{secrets.token_hex(4)}"  # this run of it: whose leases are whose
        self.max_running = self.cfg.max_running or config.scheduler.max_batch_size
        self.running: dict[int, tuple[Claim, asyncio.Task]] = {}
        self.by_account: Counter[str] = Counter()
        self.wake = asyncio.Event()  # a batch was submitted here, or an item ended: look for work now
        self._turn = 0
        self._last_upkeep = float("-inf")
        self._giving_back: set[asyncio.Task] = set()  # (held: a pending task nobody refers to may be dropped)
        self._started: set[int] = set()  # items whose task has begun (a task cancelled before it began never runs)
        self._resume_at = 0.0  # (loop time) no claims before it: backing off after a failure not an item's
        self._tasks: list[asyncio.Task] = []
        self._stopping = False  # stop() was called: an item's end is not retried (the lease decides)
        self.scratch = Path(results.temp_dir())  # (this server's own folder in it, from the start)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._claiming()), loop.create_task(self._heartbeat())]

    async def stop(self) -> None:
        """Stop claiming; items running here are given back (queued again at once for any server)."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for _, task in list(self.running.values()):
            task.cancel()
        await asyncio.gather(*self._tasks, *(t for _, t in list(self.running.values())), return_exceptions=True)
        await asyncio.gather(*list(self._giving_back), return_exceptions=True)

    # --- claiming ----------------------------------------------------------------------------------

    async def _claiming(self) -> None:
        # this server's own scratch folder (replicas may share a results folder): an earlier run's files,
        # never published, are removed
        self.scratch = Path(self.results.temp_dir()) / hashlib.sha256(self.instance.encode()).hexdigest()[:12]
        self.scratch.mkdir(parents=True, exist_ok=True)
        for left in self.scratch.glob("*.part"):
            left.unlink(missing_ok=True)
        with contextlib.suppress(DatabaseError):
            back = await asyncio.to_thread(self.store.reclaim, self.instance + "/")
            if back:
                log.info("batch: %d items an earlier run of this server left unfinished are queued again", back)
        loop = asyncio.get_running_loop()
        while True:
            pause = self.cfg.poll_s
            for step in (self._upkeep, self._fill):  # (apart: an upkeep that keeps failing never stops claiming)
                if step == self._fill and not (self.cfg.enabled and loop.time() >= self._resume_at):
                    continue
                try:
                    await step()
                except (DatabaseError, OSError, ServiceUnavailable) as e:
                    log.warning("batch: %s failed (%s); trying again in %.0f s", step.__name__.strip("_"), e, BACKOFF_S)
                    pause = BACKOFF_S
                except Exception:  # noqa: BLE001 - the loop goes on whatever one round met
                    log.exception("batch: %s failed; trying again in %.0f s", step.__name__.strip("_"), BACKOFF_S)
                    pause = BACKOFF_S
            self.wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), max(pause, self._resume_at - loop.time()))

    async def _fill(self) -> None:
        """Claim items while this server has room, accounts in turn (each within its batch_slots)."""
        if len(self.running) >= self.max_running or not self.tts.ready:
            return
        stats = self.tts.stats()
        if stats is not None and stats.scheduler.batch_waiting:  # the lane takes nothing now: claim nothing more
            return
        accounts = await asyncio.to_thread(self.store.waiting_accounts)
        while accounts and len(self.running) < self.max_running:
            self._turn += 1
            account = accounts[self._turn % len(accounts)]
            if self.by_account[account] >= self.tts.quotas.of(account).batch_slots:
                accounts.remove(account)
                continue
            claim = await asyncio.to_thread(self.store.claim, self.server, self.cfg.lease_s, account,
                                            self.cfg.max_attempts, tuple(self.running))
            if claim is None:
                accounts.remove(account)
                continue
            self.by_account[account] += 1
            task = asyncio.get_running_loop().create_task(self._run(claim))
            self.running[claim.id] = (claim, task)
            # the bookkeeping runs even for a task cancelled before it started (its body never ran)
            task.add_done_callback(lambda t, claim=claim: self._ended(claim, t))

    def _ended(self, claim: Claim, task: asyncio.Task) -> None:
        if self.running.get(claim.id, (None, None))[1] is task:
            del self.running[claim.id]
            self.by_account[claim.owner] -= 1
        if task.cancelled() and claim.id not in self._started:  # never ran: give it back
            back = asyncio.get_running_loop().create_task(self._give_back(claim))
            self._giving_back.add(back)
            back.add_done_callback(self._giving_back.discard)
        self._started.discard(claim.id)
        self.wake.set()

    async def _upkeep(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_upkeep < self.cfg.poll_s:
            return
        self._last_upkeep = loop.time()
        expired = await asyncio.to_thread(self.store.expire)
        if expired:
            log.info("batch: %d items expired (their batches' completion windows ended)", expired)
            self._count("expired", expired)
        for batch_id in await asyncio.to_thread(self.store.ended_before, timedelta(days=self.cfg.retention_days)):
            await asyncio.to_thread(self.results.delete_prefix, batch_id + "/")
            await asyncio.to_thread(self.store.delete, batch_id)
            log.info("batch %s: deleted after batch.retention_days", batch_id)
        if self.metrics is not None:
            self.metrics.set_batch(await asyncio.to_thread(self.store.load))

    # --- one item ----------------------------------------------------------------------------------

    async def _run(self, claim: Claim) -> None:
        self._started.add(claim.id)  # (see _ended)
        ext = claim.request["response_format"]
        # the attempt's own key (attempt numbers are never reused) with a token: an earlier holder's publish
        # still running in a worker thread can never overwrite it
        key = f"{claim.batch_id}/{claim.line:06d}-{claim.attempt}-{secrets.token_hex(3)}.{ext}"
        temp = self.scratch / f"{claim.id}-{claim.attempt}-{secrets.token_hex(4)}.part"
        done = None
        try:
            try:
                done = await render(self.tts, claim, temp)
                await asyncio.to_thread(self.results.publish, temp, key)
            except (DatabaseError, ServiceUnavailable, OSError) as e:  # not the item's fault: it goes back
                if done is not None:
                    done.audit.finish(CANCELLED, "cancelled")
                log.warning("batch item %s/%s given back: %s", claim.batch_id, claim.custom_id, e)
                self._back_off()
                await self._give_back(claim)
                return
            except LyreError as e:
                if not self.tts.ready:  # the engine stopped under it: not the item's fault either
                    self._back_off()
                    await self._give_back(claim)
                    return
                log.info("batch item %s/%s failed: %s", claim.batch_id, claim.custom_id, e)
                if await self._finish(claim, state="failed", error_code=e.code, error_message=str(e)):
                    self._count("failed")
                return
            # the audit row says completed only for the attempt whose result is the item's, and is completed in
            # the item's own transaction (the trail's writer would lose it to a crash right after)
            ending = done.audit.ending(FINISHED)
            finishing = asyncio.ensure_future(self._finish(
                claim, state="completed", result_key=key, sha256=done.sha256, size=done.size,
                duration_s=done.duration_s, audit_end=(done.audit.entry_id, ending) if done.audit.begun else None))
            ok = cancelled = False
            try:
                while True:
                    try:
                        ok = await asyncio.shield(finishing)
                        break
                    except asyncio.CancelledError:  # (its end may be committed all the same: learn whether it was)
                        if finishing.cancelled():  # (the event loop itself is closing)
                            raise
                        cancelled = True
            finally:
                if ok:
                    done.audit.finish(FINISHED, ending=ending)
                else:
                    done.audit.finish(CANCELLED, "cancelled")
            if not ok:  # our lease was lost meanwhile (or the item cancelled): another attempt's result counts
                if not cancelled:
                    log.warning("batch item %s/%s: lease lost before it completed; its audio is discarded",
                                claim.batch_id, claim.custom_id)
                await asyncio.to_thread(self.results.delete_prefix, key)
                if cancelled:
                    raise asyncio.CancelledError
                return
            self._count("completed", audio_s=done.duration_s, evictions=done.evictions)
            if claim.attempt > 1:  # an earlier attempt's file, published before its server died
                for k in await asyncio.to_thread(self.results.keys, f"{claim.batch_id}/{claim.line:06d}-"):
                    if k != key:
                        await asyncio.to_thread(self.results.delete_prefix, k)
        except asyncio.CancelledError:
            await self._after_cancel(claim)
        except Exception:  # noqa: BLE001 - one item's failure never stops the runner
            log.exception("batch item %s/%s failed", claim.batch_id, claim.custom_id)
            with contextlib.suppress(Exception):
                await self._finish(claim, state="failed", error_code="internal_error",
                                   error_message="the server failed on this item (its log says why)")
        finally:
            temp.unlink(missing_ok=True)
            if done is not None:  # (an attempt cut short: its row says so; a no-op once the row is complete)
                done.audit.finish(CANCELLED, "cancelled")

    async def _finish(self, claim: Claim, **values: Any) -> bool:
        """End the item in the database, retrying for up to ``lease_s`` while the database is away (the
        lease is renewed meanwhile: the item stays this server's); False when the lease was lost (or
        never came back: any server then takes the item again)."""
        give_up = asyncio.get_running_loop().time() + self.cfg.lease_s
        while True:
            try:
                return await asyncio.to_thread(self.store.finish, claim, self.server, **values)
            except DatabaseError as e:
                if self._stopping or asyncio.get_running_loop().time() > give_up:
                    log.warning("batch item %s/%s: its end could not be recorded (%s); it will run again",
                                claim.batch_id, claim.custom_id, e)
                    return False
                log.warning("batch item %s/%s: cannot record its end yet (%s)", claim.batch_id, claim.custom_id, e)
                await asyncio.sleep(BACKOFF_S)

    async def _give_back(self, claim: Claim) -> None:
        with contextlib.suppress(DatabaseError):  # (else its lease runs out, and any server takes it)
            await asyncio.to_thread(self.store.release, claim, self.server)

    def _back_off(self) -> None:
        """After a failure that is not the item's (a store or database away, the engine stopped): claim
        nothing for a while, rather than render items again and again only to give them back."""
        self._resume_at = asyncio.get_running_loop().time() + BACKOFF_S

    async def _after_cancel(self, claim: Claim) -> None:
        """Its batch is being cancelled: the item is cancelled; else this server is stopping: given back."""
        with contextlib.suppress(Exception):
            status = await asyncio.to_thread(self.store.status, claim.batch_id)
            if status == "cancelling":
                if await asyncio.to_thread(self.store.finish, claim, self.server, state="cancelled",
                                           error_code="cancelled",
                                           error_message="the batch was cancelled while this item ran"):
                    self._count("cancelled")
            else:
                await self._give_back(claim)

    # --- leases ------------------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        """Renew the leases of the items running here; stop those lost or whose batch is being cancelled."""
        while True:
            await asyncio.sleep(self.cfg.lease_s / 3)
            claims = [claim for claim, _ in self.running.values()]
            if not claims:
                continue
            try:
                lost = await asyncio.to_thread(self.store.renew, self.server, claims, self.cfg.lease_s)
                cancelling = {b for b in {c.batch_id for c in claims}
                              if await asyncio.to_thread(self.store.status, b) == "cancelling"}
            except Exception as e:  # noqa: BLE001 - the heartbeat goes on whatever one round met
                log.warning("batch: cannot renew leases now (%s: %s)", type(e).__name__, e)
                continue
            for claim in claims:
                if claim.id in lost or claim.batch_id in cancelling:
                    entry = self.running.get(claim.id)
                    if entry is not None and entry[0] is claim:
                        entry[1].cancel()

    def cancel_batch(self, batch_id: str) -> None:
        """A batch cancelled through this server: its items running here stop now (not at the next heartbeat)."""
        for claim, task in list(self.running.values()):
            if claim.batch_id == batch_id:
                task.cancel()

    def _count(self, outcome: str, n: int = 1, audio_s: float = 0.0, evictions: int = 0) -> None:
        if self.metrics is not None:
            self.metrics.batch_done(outcome, n, audio_s, evictions)
