"""``tts.batches``: batch jobs in OpenAI's Batch shape — submit a JSONL input, follow the batch, cancel
it, read its output and error files and each item's audio. Every call is by account: another
account's batch is a 404 like one never made.

    batch = await tts.batches.submit(jsonl_bytes, account="acme", idempotency_key="campaign-42")
    batch = await tts.batches.get(batch["id"], account="acme")      # status, request_counts, times
    async for line in tts.batches.output(batch["id"], account="acme"): ...   # JSONL, one item a line

The items run in the scheduler's batch lane (:mod:`lyre.core.lanes`) on any server sharing the
database (:mod:`lyre.service.batch.runner`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote

from lyre.audio.formats import CONTENT_TYPES
from lyre.config.schema import window_seconds
from lyre.errors import InvalidRequest, NotReady, UnknownBatch, UploadTooLarge
from lyre.service.batch import inputs
from lyre.service.batch.render import segments_of
from lyre.storage.batches import ENDED_ITEM, BatchStore
from lyre.storage.registry import in_utc
from lyre.storage.results import ResultStore

MAX_METADATA = 16  # OpenAI's: 16 pairs, keys of 64 characters, values of 512


class BatchJobs:
    def __init__(self, tts: Any, store: BatchStore, results: ResultStore, runner: Any = None):
        self.tts, self.store, self.results, self.runner = tts, store, results, runner
        self.cfg = tts.config.batch

    async def submit(self, data: bytes, *, account: str, completion_window: str | None = None,
                     idempotency_key: str | None = None, metadata: dict[str, str] | None = None) -> dict[str, Any]:
        """Check ``data`` (JSONL) whole, then store it as a batch: its batch object. InvalidBatch (400)
        lists the bad lines; UploadTooLarge (413) past the account's ``batch_input_bytes``;
        QuotaExceeded (429) past its ``batch_items``; with an ``idempotency_key`` used before, that batch."""
        limits = self.tts.quotas.of(account)
        if len(data) > limits.batch_input_bytes:
            raise UploadTooLarge(f"the batch input is larger than {limits.batch_input_bytes} bytes "
                                 "(accounts.batch_input_bytes)")
        window = completion_window or self.cfg.completion_window
        window_s = self.window_s(window)
        meta = _metadata(metadata)
        if idempotency_key is not None and not (isinstance(idempotency_key, str) and 0 < len(idempotency_key) <= 255):
            raise InvalidRequest("Idempotency-Key must be 1-255 characters")
        digest = hashlib.sha256(data).hexdigest()
        if idempotency_key is not None:  # a resubmission is answered without checking its input again
            before = await asyncio.to_thread(self.store.existing, account, idempotency_key)
            if before is not None and before["input_sha256"] == digest:
                return await self.get(before["id"], account=account)
        items = await asyncio.to_thread(inputs.read, data, self.cfg.max_items_per_batch, self._checker(account))
        row, created = await asyncio.to_thread(
            self.store.create, owner=account, items=[{"line": i.line, "custom_id": i.custom_id, "request": i.request}
                                                     for i in items],
            input_sha256=digest, input_bytes=len(data), completion_window=window, window_s=window_s, meta=meta,
            idempotency_key=idempotency_key, max_items=limits.batch_items)
        if created and self.runner is not None:
            self.runner.wake.set()
        return await self.get(row["id"], account=account)

    def window_s(self, window: Any) -> float:
        seconds = window_seconds(window)
        if seconds is None or not 0 < seconds <= self.cfg.max_completion_window_s:
            raise InvalidRequest(f"completion_window {window!r}: give a duration such as 24h, 90m or 3600s, up to "
                                 f"{self.cfg.max_completion_window_s:.0f} s (batch.max_completion_window_s)")
        return float(seconds)

    def _checker(self, account: str):
        """What each item must pass at validation: its voice is the account's, its text makes segments."""
        voices: dict[Any, Any] = {}

        def check(request: dict[str, Any], voice: Any) -> None:
            if voice not in voices:
                voices[voice] = self.tts.voices.resolve_now(voice, account)
            segments_of(self.tts, request["text"], voices[voice], request["options"], account)

        return check

    async def get(self, batch_id: Any, *, account: str) -> dict[str, Any]:
        return batch_object(await asyncio.to_thread(self.store.get, batch_id, account))

    async def list(self, *, account: str, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        if not (isinstance(limit, int) and 1 <= limit <= 100):
            raise InvalidRequest("'limit' must be 1-100")
        rows, more = await asyncio.to_thread(self.store.list, account, limit, after)
        data = [batch_object(r) for r in rows]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": more}

    async def cancel(self, batch_id: Any, *, account: str) -> dict[str, Any]:
        row = await asyncio.to_thread(self.store.cancel, batch_id, account)
        if self.runner is not None:
            self.runner.cancel_batch(row["id"])
        return batch_object(row)

    async def output(self, batch_id: Any, *, account: str) -> AsyncIterator[bytes]:
        """The output file: a JSONL line per completed item, in input order."""
        async for row in self._rows(batch_id, account, ("completed",)):
            yield _line({"custom_id": row["custom_id"], "status": "completed", "line": row["line"],
                         "response_format": row["request"]["response_format"], "duration_s": row["duration_s"],
                         "bytes": row["bytes"], "sha256": row["sha256"], "audio_url": audio_url(batch_id, row["custom_id"]),
                         "location": self._location(row["result_key"])})

    def _location(self, key: str) -> str:
        """Where the file is: its full address in an S3 store; its key under the server's own folder (whose
        path is the server's business)."""
        return f"{self.results.where}/{key}" if self.results.where.startswith("s3://") else key

    async def errors(self, batch_id: Any, *, account: str) -> AsyncIterator[bytes]:
        """The error file: a JSONL line per item that failed, was cancelled or expired, in input order."""
        async for row in self._rows(batch_id, account, tuple(s for s in ENDED_ITEM if s != "completed")):
            yield _line({"custom_id": row["custom_id"], "status": row["state"], "line": row["line"],
                         "error": {"code": row["error_code"], "message": row["error_message"]}})

    async def _rows(self, batch_id: Any, account: str, states: tuple[str, ...]) -> AsyncIterator[dict[str, Any]]:
        pages: Iterator[dict[str, Any]] = self.store.items(batch_id, account, states)
        while True:
            row = await asyncio.to_thread(next, pages, None)
            if row is None:
                return
            yield row

    async def audio(self, batch_id: Any, custom_id: str, *, account: str) -> tuple[Iterator[bytes], int, str]:
        """An item's audio file: (its chunks, its size, its content type). UnknownBatch (404); NotReady
        (409) while it is not completed."""
        row = await asyncio.to_thread(self.store.item, batch_id, account, custom_id)
        if row["state"] != "completed":
            raise NotReady(f"item {custom_id!r} is {row['state']}: its audio exists once it is completed")
        try:
            chunks, size = await asyncio.to_thread(self.results.open, row["result_key"])
        except KeyError:
            raise UnknownBatch(f"the audio of item {custom_id!r} is gone (batch.retention_days)") from None
        return chunks, size, CONTENT_TYPES[row["request"]["response_format"]]


def audio_url(batch_id: str, custom_id: str) -> str:
    return f"/v1/batches/{batch_id}/items/{quote(custom_id, safe='')}/audio"


def batch_object(row: dict[str, Any]) -> dict[str, Any]:
    """A batch as OpenAI's Batch object shows one, with Lyre's counts and file addresses."""
    counts = row["counts"]

    def stamp(t: Any) -> int | None:
        return int(in_utc(t).timestamp()) if t is not None else None

    ended, status = row["ended_at"], row["status"]
    return {
        "id": row["id"], "object": "batch", "endpoint": "/v1/audio/speech", "status": status,
        "completion_window": row["completion_window"], "created_at": stamp(row["created_at"]),
        "in_progress_at": stamp(row["created_at"]), "expires_at": stamp(row["expires_at"]),
        "finalizing_at": stamp(ended) if status == "completed" else None,
        "completed_at": stamp(ended) if status == "completed" else None,
        "cancelling_at": stamp(row["cancelling_at"]), "cancelled_at": stamp(ended) if status == "cancelled" else None,
        "expired_at": stamp(ended) if status == "expired" else None, "failed_at": None,
        "request_counts": {"total": row["total"], "completed": counts["completed"], "failed": counts["failed"],
                           "queued": counts["queued"], "running": counts["running"],
                           "cancelled": counts["cancelled"], "expired": counts["expired"]},
        "output_url": f"/v1/batches/{row['id']}/output", "error_url": f"/v1/batches/{row['id']}/errors",
        "input_bytes": row["input_bytes"], "metadata": row["meta"],
    }


def _metadata(metadata: Any) -> dict[str, str]:
    if metadata is None:
        return {}
    if (not isinstance(metadata, dict) or len(metadata) > MAX_METADATA
            or not all(isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                       for k, v in metadata.items())):
        raise InvalidRequest(f"'metadata' must be an object of at most {MAX_METADATA} string pairs (keys up to 64 "
                             "characters, values up to 512)")
    return metadata


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode()

