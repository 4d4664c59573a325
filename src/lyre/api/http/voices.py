"""REST for voices: the built-in ones and each account's cloned ones.

- ``GET /v1/voices``: built-in voices (with their aliases) and the caller's cloned voices; each
  entry's ``id`` is what a request passes as ``voice``.
- ``POST /v1/voices`` (multipart/form-data): ``audio`` (a file: wav, flac, mp3, ogg/opus, ...; any
  rate, mono or stereo, 3-30 s), ``transcript`` (the exact words spoken), ``name``, ``consent`` (a
  JSON object: ``granted``, ``speaker``, ``source``, ``statement``) -> 201 and the voice.
- ``GET /v1/voices/{id}``, ``DELETE /v1/voices/{id}`` (204), ``GET /v1/voices/{id}/consent``.

Another account's voice, a deleted one and a malformed id are all 404, worded the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import BodyPartReader, web

from lyre.api.common import json_object
from lyre.api.http.shared import ACCOUNT, INFLIGHT, SERVICE, draining, multipart_errors
from lyre.errors import InvalidRequest, UploadTooLarge
from lyre.storage.registry import Voice

FIELD_LIMITS = {"transcript": 64 * 1024, "name": 4 * 1024, "consent": 16 * 1024}
USAGE = "send the enrollment as multipart/form-data with fields audio (a file), transcript, name and consent (JSON)"


def routes(app: web.Application) -> None:
    app.router.add_get("/v1/voices", list_voices)
    app.router.add_post("/v1/voices", enroll)
    app.router.add_get("/v1/voices/{voice_id}", get_voice)
    app.router.add_delete("/v1/voices/{voice_id}", delete_voice)
    app.router.add_get("/v1/voices/{voice_id}/consent", get_consent)


def _ctx(request: web.Request) -> tuple[Any, str]:
    return request.app[SERVICE], request[ACCOUNT]


def builtin_entry(service: Any, name: str) -> dict[str, Any]:
    return {"id": name, "name": name, "type": "builtin", "aliases": service.config.model.aliases_of(name)}


async def list_voices(request: web.Request) -> web.Response:
    service, account = _ctx(request)
    cloned = await service.voices.list(account)
    return web.json_response({"voices": [builtin_entry(service, v) for v in service.builtin_voices]
                              + [v.summary() for v in cloned],
                              "default": service.config.model.default_voice})


async def get_voice(request: web.Request) -> web.Response:
    service, account = _ctx(request)
    voice = await service.voices.resolve(request.match_info["voice_id"], account)
    return web.json_response(voice.summary() if isinstance(voice, Voice) else builtin_entry(service, voice))


async def get_consent(request: web.Request) -> web.Response:
    service, account = _ctx(request)
    voice_id = request.match_info["voice_id"]
    if service.config.model.resolve_voice(voice_id) is not None:
        raise InvalidRequest(f"{voice_id!r} is a built-in voice: only cloned voices carry a consent record")
    return web.json_response({"id": voice_id, "consent": await service.voices.consent(voice_id, account)})


async def delete_voice(request: web.Request) -> web.Response:
    service, account = _ctx(request)
    voice_id = request.match_info["voice_id"]
    if service.config.model.resolve_voice(voice_id) is not None:
        raise InvalidRequest(f"{voice_id!r} is a built-in voice: only cloned voices can be deleted")
    await service.voices.delete(voice_id, account)
    return web.Response(status=204)


async def enroll(request: web.Request) -> web.Response:
    draining(request)
    service, account = _ctx(request)
    with service.quotas.hold(account, "enrollments"):  # from the upload's start: one account's uploads are bounded
        form = await read_form(request, service.config.voices.max_upload_bytes)
        if "audio" not in form:
            raise InvalidRequest("the form field 'audio' (the reference recording) is required")
        consent: Any = form.get("consent")
        if consent is not None:
            consent = json_object(consent, "'consent'")
        address = request.app[INFLIGHT].address(request.remote, request.headers.get("X-Forwarded-For"))
        voice = await service.voices.enroll(form.get("audio", b""), name=form.get("name"),
                                            transcript=form.get("transcript"), consent=consent, account=account,
                                            address=address)
    return web.json_response(voice.summary(), status=201, headers={"Location": f"/v1/voices/{voice.id}"})


async def read_form(request: web.Request, max_audio_bytes: int, file: str = "audio",
                    fields: Mapping[str, int] = FIELD_LIMITS, usage: str = USAGE) -> dict[str, Any]:
    """A form of one audio ``file`` (bytes, at most ``max_audio_bytes``) and text ``fields`` (each
    within its limit in bytes): the enrollment's by default. Anything else is refused before it is
    read in full; ``usage`` says what to send instead of another body."""
    if not request.content_type.startswith("multipart/form-data"):
        raise InvalidRequest(usage)
    form: dict[str, Any] = {}
    names = [file, *fields]
    with multipart_errors():
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader) or part.name not in names:
                raise InvalidRequest(f"unknown form field {getattr(part, 'name', None)!r}; the fields are "
                                     f"{', '.join(names[:-1])} and {names[-1]}")
            if part.name in form:
                raise InvalidRequest(f"the form field {part.name!r} is given twice")
            limit = max_audio_bytes if part.name == file else fields[part.name]
            data = await read_part(part, limit, is_file=part.name == file)
            if part.name == file:
                form[file] = data
            else:
                try:
                    form[part.name] = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise InvalidRequest(f"the form field {part.name!r} is not UTF-8 text") from None
    return form


async def read_part(part: BodyPartReader, limit: int, is_file: bool | None = None) -> bytes:
    """The part's bytes, at most ``limit``: an audio file over it is UploadTooLarge (413), a text
    field InvalidRequest (``is_file``: whether it is the file; by default, whether it is named audio)."""
    chunks, size = [], 0
    while chunk := await part.read_chunk(64 * 1024):
        size += len(chunk)
        if size > limit:
            if is_file if is_file is not None else part.name == "audio":
                raise UploadTooLarge(f"the audio file is larger than {limit} bytes (voices.max_upload_bytes)")
            raise InvalidRequest(f"the form field {part.name!r} is longer than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
