"""``POST /v1/audio/verify``: does an audio file carry Lyre's watermark?

The upload is a multipart/form-data field ``audio`` (as for enrollment) or the raw file as the
body; any format FFmpeg reads (raw G.711 or PCM must be wrapped, e.g. in WAV). The answer:
``{"watermarked", "score", "threshold", "seconds"}`` (see :mod:`lyre.audio.watermark`).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from lyre.api.http.shared import SERVICE, draining
from lyre.api.http.voices import read_part
from lyre.audio.clip import decode
from lyre.errors import InvalidRequest, OverloadedError, UploadTooLarge

MAX_SECONDS = 120.0  # longer uploads are checked on their first two minutes
CONCURRENT = 2  # verifications decoding at once (each can take a second of CPU); more get 429


class Places:
    """The verifications decoding at once in one application. A place is taken once the upload has
    been read, for the decoding and the detection only: an upload that stalls mid-body holds its
    connection, never a place (two stalled uploads held both, and everyone got 429)."""

    def __init__(self, n: int = CONCURRENT) -> None:
        self.n, self.taken = n, 0

    def __enter__(self) -> Places:
        if self.taken >= self.n:
            raise OverloadedError(1.0)
        self.taken += 1
        return self

    def __exit__(self, *exc) -> None:
        self.taken -= 1


PLACES = web.AppKey("verify_places", Places)


def routes(app: web.Application) -> None:
    app[PLACES] = Places()
    app.router.add_post("/v1/audio/verify", verify)


async def verify(request: web.Request) -> web.Response:
    draining(request)
    service = request.app[SERVICE]
    data = await _upload(request, service.config.voices.max_upload_bytes)
    with request.app[PLACES]:
        pcm, rate = await asyncio.to_thread(decode, data, MAX_SECONDS)
        found = await asyncio.to_thread(service.watermark.detect, pcm, rate)
    return web.json_response({"watermarked": found.watermarked, "score": round(found.score, 2),
                              "threshold": found.threshold, "seconds": round(found.seconds, 3)})


async def _upload(request: web.Request, limit: int) -> bytes:
    """The whole uploaded file (multipart field ``audio``, or the body), at most ``limit`` bytes."""
    too_large = UploadTooLarge(f"the audio file is larger than {limit} bytes (voices.max_upload_bytes)")
    if request.content_type.startswith("multipart/form-data"):
        try:
            part = await (await request.multipart()).next()
        except (ValueError, AssertionError) as e:
            raise InvalidRequest(f"the body is not valid multipart/form-data: {e}") from None
        if part is None or getattr(part, "name", None) != "audio":
            raise InvalidRequest("send the audio as the multipart/form-data field 'audio', or as the request body")
        data = await read_part(part, limit)
    else:
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        chunks, size = [], 0
        while chunk := await request.content.read(64 * 1024):  # (one read returns only what has arrived)
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        data = b"".join(chunks)
    if not data:
        raise InvalidRequest("no audio: send a file as the body or as the form field 'audio'")
    return data
