"""OpenAI's custom voices and voice consents (the openai SDK's ``client.audio.voices`` and
``client.audio.voice_consents``) on Lyre's cloned voices and consent recordings
(:mod:`lyre.service.consents`), answered with OpenAI's objects:

- ``POST /v1/audio/voice_consents`` (multipart/form-data: ``recording`` a file, ``name``,
  ``language``) -> ``audio.voice_consent``; ``GET /v1/audio/voice_consents`` (``after``, ``limit``:
  a cursor page, newest first); ``GET``, ``POST`` (JSON ``{"name"}``: a new label) and ``DELETE``
  ``/v1/audio/voice_consents/{consent_id}`` (409 while voices created with it exist).
- ``POST /v1/audio/voices`` (multipart/form-data: ``audio_sample`` a file, ``consent`` a recording's
  id, ``name``, and Lyre's ``transcript``: the exact words of the sample, which OpenAI does not ask
  for) -> ``audio.voice``; ``DELETE /v1/audio/voices/{voice_id}``. And, not in OpenAI's API,
  ``GET /v1/audio/voices`` (a cursor page) and ``GET /v1/audio/voices/{voice_id}``.

These are the voices of ``/v1/voices`` (one registry): a voice created here is used by id on every
protocol, ``voice={"id": ...}`` in the SDK's speech calls included, and any of the account's cloned
voices is listed and deleted here. Each account sees only its own voices and recordings; another
account's, a deleted one and a malformed id are all 404, worded the same. Created objects answer
200, as OpenAI's do (Lyre's own ``POST /v1/voices`` answers 201).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from aiohttp import web

from lyre.api.http.shared import ACCOUNT, INFLIGHT, SERVICE, draining, json_body
from lyre.api.http.voices import read_form
from lyre.errors import InvalidRequest, shorten
from lyre.service.options import ConsentRename, parse
from lyre.storage.consents import ConsentRecording
from lyre.storage.registry import Voice

CONSENT_FIELDS = {"name": 4 * 1024, "language": 256}
VOICE_FIELDS = {"consent": 256, "name": 4 * 1024, "transcript": 64 * 1024, "type": 64,
                "prompt": 16 * 1024, "model": 256, "script_hint": 16 * 1024}  # (the last three: to say no clearly)
PROMPT_ONLY = ("prompt", "model", "script_hint")
DEFAULT_LIMIT, MAX_LIMIT = 20, 100  # a list page's (OpenAI's)
T = TypeVar("T", ConsentRecording, Voice)


def routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/voice_consents", create_consent)
    app.router.add_get("/v1/audio/voice_consents", list_consents)
    app.router.add_get("/v1/audio/voice_consents/{consent_id}", get_consent)
    app.router.add_post("/v1/audio/voice_consents/{consent_id}", rename_consent)
    app.router.add_delete("/v1/audio/voice_consents/{consent_id}", delete_consent)
    app.router.add_post("/v1/audio/voices", create_voice)
    app.router.add_get("/v1/audio/voices", list_voices)
    app.router.add_get("/v1/audio/voices/{voice_id}", get_voice)
    app.router.add_delete("/v1/audio/voices/{voice_id}", delete_voice)


def consent_object(consent: ConsentRecording) -> dict[str, Any]:
    return {"id": consent.id, "object": "audio.voice_consent", "created_at": int(consent.created_at.timestamp()),
            "name": consent.name, "language": consent.language}


def voice_object(voice: Voice) -> dict[str, Any]:
    return {"id": voice.id, "object": "audio.voice", "created_at": int(voice.created_at.timestamp()),
            "name": voice.name, "type": "audio_sample"}


def _ctx(request: web.Request) -> tuple[Any, str]:
    return request.app[SERVICE], request[ACCOUNT]


def _address(request: web.Request) -> str:
    return request.app[INFLIGHT].address(request.remote, request.headers.get("X-Forwarded-For"))


# --- voice consents ---------------------------------------------------------------------------


async def create_consent(request: web.Request) -> web.Response:
    draining(request)
    service, account = _ctx(request)
    with service.quotas.hold(account, "enrollments"):  # (an upload like an enrollment's)
        form = await read_form(request, service.config.voices.max_upload_bytes, file="recording",
                               fields=CONSENT_FIELDS, usage="send the consent recording as multipart/form-data with "
                               "fields recording (a file), name and language")
        if "recording" not in form:
            raise InvalidRequest("the form field 'recording' (the speaker's consent statement, a file) is required")
        consent = await service.consents.record(form["recording"], name=form.get("name"),
                                                language=form.get("language"), account=account,
                                                address=_address(request))
    return web.json_response(consent_object(consent))


async def list_consents(request: web.Request) -> web.Response:
    service, account = _ctx(request)
    return web.json_response(_page(request, await service.consents.list(account), consent_object))


async def get_consent(request: web.Request) -> web.Response:
    service, account = _ctx(request)
    return web.json_response(consent_object(await service.consents.get(request.match_info["consent_id"], account)))


async def rename_consent(request: web.Request) -> web.Response:
    service, account = _ctx(request)
    body = parse(ConsentRename, await json_body(request))
    consent = await service.consents.rename(request.match_info["consent_id"], body.name, account)
    return web.json_response(consent_object(consent))


async def delete_consent(request: web.Request) -> web.Response:
    service, account = _ctx(request)
    consent_id = request.match_info["consent_id"]
    await service.consents.delete(consent_id, account)
    return web.json_response({"id": consent_id, "deleted": True, "object": "audio.voice_consent"})


# --- voices -----------------------------------------------------------------------------------


async def create_voice(request: web.Request) -> web.Response:
    draining(request)
    service, account = _ctx(request)
    with service.quotas.hold(account, "enrollments"):
        form = await read_form(request, service.config.voices.max_upload_bytes, file="audio_sample",
                               fields=VOICE_FIELDS, usage="send the voice as multipart/form-data with fields "
                               "audio_sample (a file), consent (a consent recording's id), name and transcript")
        _check_type(form)
        if "audio_sample" not in form:
            raise InvalidRequest("the form field 'audio_sample' (the recording to clone, a file) is required")
        if "consent" not in form:
            raise InvalidRequest("'consent' is required: the id of the speaker's consent recording "
                                 "(POST /v1/audio/voice_consents)")
        if "transcript" not in form and getattr(service.voices.cloning, "needs_transcript", True):
            raise InvalidRequest("'transcript' is required: the exact words spoken in audio_sample (Lyre clones a "
                                 "voice from a recording and its transcript; with the openai SDK pass "
                                 "extra_body={\"transcript\": \"...\"})")
        voice = await service.consents.enroll(form["audio_sample"], consent=form["consent"], name=form.get("name"),
                                              transcript=form.get("transcript"), account=account,
                                              address=_address(request))
    return web.json_response(voice_object(voice))


def _check_type(form: dict[str, Any]) -> None:
    kind = form.get("type", "audio_sample")
    if kind == "prompt":
        raise InvalidRequest("type 'prompt' is not supported: Lyre clones voices from a recording of the speaker "
                             "(type 'audio_sample', with a consent recording), it does not design them from a "
                             "description")
    if kind != "audio_sample":
        raise InvalidRequest(f"'type' must be 'audio_sample', not {shorten(kind)}")
    given = [f for f in PROMPT_ONLY if f in form]
    if given:
        raise InvalidRequest(f"{', '.join(given)}: only for type 'prompt', which Lyre does not support")


async def list_voices(request: web.Request) -> web.Response:
    """The account's cloned voices, newest first (Lyre's: OpenAI's API lists none)."""
    service, account = _ctx(request)
    return web.json_response(_page(request, (await service.voices.list(account))[::-1], voice_object))


async def get_voice(request: web.Request) -> web.Response:
    service, account = _ctx(request)
    return web.json_response(voice_object(await service.voices.get(_cloned(request), account)))


async def delete_voice(request: web.Request) -> web.Response:
    """As ``DELETE /v1/voices/{id}``: the voice, its audio and its cached state go at once; its
    consent recording stays."""
    service, account = _ctx(request)
    voice_id = _cloned(request)
    await service.voices.delete(voice_id, account)
    return web.json_response({"id": voice_id, "deleted": True, "object": "audio.voice.deleted"})


def _cloned(request: web.Request) -> str:
    voice_id = request.match_info["voice_id"]
    if request.app[SERVICE].config.model.resolve_voice(voice_id) is not None:
        raise InvalidRequest(f"{voice_id!r} is a built-in voice: /v1/audio/voices holds only cloned voices "
                             "(GET /v1/voices lists both)")
    return voice_id


# --- pages ------------------------------------------------------------------------------------


def _page(request: web.Request, items: Sequence[T], shape: Callable[[T], dict[str, Any]]) -> dict[str, Any]:
    """OpenAI's cursor page of ``items`` (in order): ``limit`` of them (1-100, default 20) after
    the one whose id is ``after``."""
    query = request.query
    unknown = [k for k in query if k not in ("after", "limit")]
    if unknown:
        raise InvalidRequest(f"unknown query parameter {shorten(unknown[0])}; the parameters are after and limit")
    for key in ("after", "limit"):
        if len(query.getall(key, [])) > 1:
            raise InvalidRequest(f"the query parameter {key!r} is given twice")
    limit = query.get("limit", str(DEFAULT_LIMIT))
    if not (len(limit) <= 3 and limit.isascii() and limit.isdigit() and 1 <= int(limit) <= MAX_LIMIT):
        raise InvalidRequest(f"'limit' must be a whole number from 1 to {MAX_LIMIT}, not {shorten(limit)}")
    start = 0
    if "after" in query:
        start = next((i + 1 for i, item in enumerate(items) if item.id == query["after"]), -1)
        if start < 0:
            raise InvalidRequest(f"'after' {shorten(query['after'])} is not one of this account's ids: pass the "
                                 "last id of the previous page")
    page = items[start:start + int(limit)]
    return {"object": "list", "data": [shape(item) for item in page],
            "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None,
            "has_more": start + len(page) < len(items)}
