"""``POST /v1/audio/verify``: does an audio file carry Lyre's watermark?

The upload is a multipart/form-data field ``audio`` (as for enrollment) or the raw file as the
body; any format FFmpeg reads (raw G.711 or PCM must be wrapped, e.g. in WAV). The answer:
``{"watermarked", "score", "threshold", "seconds"}`` (see :mod:`lyre.audio.watermark`).
"""

from __future__ import annotations

from aiohttp import web

from lyre.api.http.shared import ACCOUNT, SERVICE, draining, multipart_errors
from lyre.api.http.voices import read_part
from lyre.audio.clip import decode
from lyre.errors import InvalidRequest, UploadTooLarge

MAX_SECONDS = 120.0  # longer uploads are checked on their first two minutes


def routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/verify", verify)


async def verify(request: web.Request) -> web.Response:
    """The account holds one of its ``accounts.max_verifies`` from the start of the upload; the
    decoding and the detection take a place in the audio workers once it has been read (an upload
    that stalls mid-body holds its connection and its account's place, never everyone's)."""
    draining(request)
    service, account = request.app[SERVICE], request[ACCOUNT]
    with service.quotas.hold(account, "verifies"):
        data = await _upload(request, service.config.voices.max_upload_bytes)
        workers = service.voices.workers
        with workers.place():
            pcm, rate = await workers.run(decode, data, MAX_SECONDS, account=account)
            found = await workers.run(service.watermark.detect, pcm, rate, account=account)
    return web.json_response({"watermarked": found.watermarked, "score": round(found.score, 2),
                              "threshold": found.threshold, "seconds": round(found.seconds, 3)})


async def _upload(request: web.Request, limit: int) -> bytes:
    """The whole uploaded file (multipart field ``audio``, or the body), at most ``limit`` bytes."""
    too_large = UploadTooLarge(f"the audio file is larger than {limit} bytes (voices.max_upload_bytes)")
    if request.content_type.startswith("multipart/form-data"):
        with multipart_errors():
            part = await (await request.multipart()).next()
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
