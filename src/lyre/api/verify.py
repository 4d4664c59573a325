"""``POST /v1/audio/verify``: does an audio file carry Lyre's watermark?

The upload is a multipart/form-data field ``audio`` (as for enrollment) or the raw file as the
body; any format FFmpeg reads (raw G.711 or PCM must be wrapped, e.g. in WAV). The answer:
``{"watermarked", "score", "threshold", "seconds"}`` (see :mod:`lyre.watermark`).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from lyre.api.http import SERVICE
from lyre.api.voices import read_part
from lyre.errors import InvalidRequest, UploadTooLarge
from lyre.voices.clip import decode

MAX_SECONDS = 600.0  # longer uploads are checked on their first ten minutes


def routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/verify", verify)


async def verify(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    limit = service.config.voices.max_upload_bytes
    if request.content_type.startswith("multipart/form-data"):
        reader = await request.multipart()
        part = await reader.next()
        if part is None or getattr(part, "name", None) != "audio":
            raise InvalidRequest("send the audio as the multipart/form-data field 'audio', or as the request body")
        data = await read_part(part, limit)
    else:
        if request.content_length is not None and request.content_length > limit:
            raise UploadTooLarge(f"the audio file is larger than {limit} bytes (voices.max_upload_bytes)")
        data = await request.content.read(limit + 1)
        if len(data) > limit:
            raise UploadTooLarge(f"the audio file is larger than {limit} bytes (voices.max_upload_bytes)")
    if not data:
        raise InvalidRequest("no audio: send a file as the body or as the form field 'audio'")
    pcm, rate = await asyncio.to_thread(decode, data, MAX_SECONDS)
    found = await asyncio.to_thread(service.watermark.detect, pcm, rate)
    return web.json_response({"watermarked": found.watermarked, "score": round(found.score, 2),
                              "threshold": found.threshold, "seconds": round(found.seconds, 3)})
