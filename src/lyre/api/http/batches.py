"""REST for batch jobs (:mod:`lyre.service.batch`), in OpenAI's Batch shape where it fits, each account's own:

- ``POST /v1/batches``: the body is the JSONL input itself (``Content-Type: application/jsonl``,
  ``application/x-ndjson`` or ``text/plain``); ``?completion_window=24h``, ``?metadata=<JSON object>``;
  an ``Idempotency-Key`` header makes a resubmission answer the same batch -> 200 and the batch object;
- ``GET /v1/batches`` (``?limit=``, ``?after=``), ``GET /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``;
- ``GET /v1/batches/{id}/output`` and ``/errors``: JSONL files, one item a line, in input order;
- ``GET /v1/batches/{id}/items/{custom_id}/audio``: an item's audio, once completed (409 before).

Another account's batch, and an id not even well formed, are 404, worded the same.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from lyre.api.common import json_object
from lyre.api.http.shared import ACCOUNT, SERVICE, draining
from lyre.errors import InvalidRequest, ServiceUnavailable, UnsupportedMediaType, UploadTooLarge

JSONL_TYPES = ("application/jsonl", "application/x-ndjson", "application/json-lines", "text/plain",
               "application/octet-stream")


def routes(app: web.Application) -> None:
    app.router.add_post("/v1/batches", create_batch)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{batch_id}", get_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", cancel_batch)
    app.router.add_get("/v1/batches/{batch_id}/output", output)
    app.router.add_get("/v1/batches/{batch_id}/errors", errors)
    app.router.add_get("/v1/batches/{batch_id}/items/{custom_id}/audio", audio)


def _ctx(request: web.Request) -> tuple[Any, str]:
    jobs = request.app[SERVICE].batches
    if jobs is None:
        raise ServiceUnavailable("batch jobs need the database, which this service has not opened")
    return jobs, request[ACCOUNT]


async def create_batch(request: web.Request) -> web.Response:
    draining(request)
    jobs, account = _ctx(request)
    if request.content_type not in JSONL_TYPES:
        raise UnsupportedMediaType(f"send the JSONL input as the body with 'Content-Type: application/jsonl' (got "
                                   f"{request.content_type})")
    limit = request.app[SERVICE].quotas.of(account).batch_input_bytes
    data = await _read(request, limit)
    metadata = request.query.get("metadata")
    batch = await jobs.submit(data, account=account, completion_window=request.query.get("completion_window"),
                              idempotency_key=request.headers.get("Idempotency-Key"),
                              metadata=json_object(metadata, "'metadata'") if metadata is not None else None)
    return web.json_response(batch, headers={"Location": f"/v1/batches/{batch['id']}"})


async def _read(request: web.Request, limit: int) -> bytes:
    """The body, at most ``limit`` bytes (413 naming the limit, before reading it when it is declared)."""
    too_large = UploadTooLarge(f"the batch input is larger than {limit} bytes (accounts.batch_input_bytes)")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    chunks, size = [], 0
    while chunk := await request.content.read(1 << 16):
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def list_batches(request: web.Request) -> web.Response:
    jobs, account = _ctx(request)
    raw = request.query.get("limit", "20")
    if not (raw.isascii() and raw.isdecimal()) or len(raw) > 3:
        raise InvalidRequest("'limit' must be 1-100")
    return web.json_response(await jobs.list(account=account, limit=int(raw), after=request.query.get("after")))


async def get_batch(request: web.Request) -> web.Response:
    jobs, account = _ctx(request)
    return web.json_response(await jobs.get(request.match_info["batch_id"], account=account))


async def cancel_batch(request: web.Request) -> web.Response:
    jobs, account = _ctx(request)
    return web.json_response(await jobs.cancel(request.match_info["batch_id"], account=account))


async def output(request: web.Request) -> web.StreamResponse:
    jobs, account = _ctx(request)
    return await _jsonl(request, jobs.output(request.match_info["batch_id"], account=account))


async def errors(request: web.Request) -> web.StreamResponse:
    jobs, account = _ctx(request)
    return await _jsonl(request, jobs.errors(request.match_info["batch_id"], account=account))


async def _jsonl(request: web.Request, lines: Any) -> web.StreamResponse:
    """Stream a JSONL file (a large batch's output is never all in memory); its first line is read before the
    status is sent, so an unknown batch is still a 404."""
    first = await anext(lines, None)
    resp = web.StreamResponse(headers={"Content-Type": "application/jsonl", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    if first is not None:
        await resp.write(first)
        async for line in lines:
            await resp.write(line)
    await resp.write_eof()
    return resp


async def audio(request: web.Request) -> web.StreamResponse:
    jobs, account = _ctx(request)
    chunks, size, content_type = await jobs.audio(request.match_info["batch_id"], request.match_info["custom_id"],
                                                  account=account)
    try:
        resp = web.StreamResponse(headers={"Content-Type": content_type, "Content-Length": str(size)})
        await resp.prepare(request)
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:  # (a file or S3 read blocks)
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()



