"""REST for pronunciation lexicons (:mod:`lyre.service.lexicons`), each account's own:

- ``POST /v1/lexicons`` (JSON: ``name``, ``pls``, ``default``) -> 201 and the lexicon;
- ``GET /v1/lexicons``: the caller's lexicons, oldest first;
- ``GET /v1/lexicons/{id}``: one, with its PLS document; ``DELETE /v1/lexicons/{id}`` (204).

Another account's lexicon, a deleted one and a malformed id are all 404, worded the same.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from lyre.api.http.shared import ACCOUNT, SERVICE, draining, json_body
from lyre.service.options import LexiconCreate, parse


def routes(app: web.Application) -> None:
    app.router.add_get("/v1/lexicons", list_lexicons)
    app.router.add_post("/v1/lexicons", create_lexicon)
    app.router.add_get("/v1/lexicons/{lexicon_id}", get_lexicon)
    app.router.add_delete("/v1/lexicons/{lexicon_id}", delete_lexicon)


def _ctx(request: web.Request) -> tuple[Any, str]:
    return request.app[SERVICE], request[ACCOUNT]


async def create_lexicon(request: web.Request) -> web.Response:
    draining(request)
    service, account = _ctx(request)
    body = parse(LexiconCreate, await json_body(request))
    stored = await service.lexicons.create(body.pls, name=body.name, default=body.default, account=account,
                                           protocol="rest")
    return web.json_response(stored.summary(), status=201, headers={"Location": f"/v1/lexicons/{stored.id}"})


async def list_lexicons(request: web.Request) -> web.Response:
    service, account = _ctx(request)
    return web.json_response({"lexicons": [x.summary() for x in await service.lexicons.list(account)]})


async def get_lexicon(request: web.Request) -> web.Response:
    service, account = _ctx(request)
    stored = await service.lexicons.get(request.match_info["lexicon_id"], account, with_pls=True)
    return web.json_response({**stored.summary(), "pls": stored.pls})


async def delete_lexicon(request: web.Request) -> web.Response:
    service, account = _ctx(request)
    await service.lexicons.delete(request.match_info["lexicon_id"], account, protocol="rest")
    return web.Response(status=204)
