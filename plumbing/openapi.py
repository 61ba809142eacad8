"""GET /openapi.json: each service serves the OpenAPI document kept in its package.

The document is package data (`sink/openapi.json`, `publisher/openapi.json`), so an
installed copy serves the same bytes as a source tree. It is read once, when the
route is added: a package built without it fails at `create_app`, not on a request.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Final

from aiohttp import web

DOCUMENT: Final = "openapi.json"
OPENAPI_PATH: Final = "/openapi.json"


def document_bytes(package: str) -> bytes:
    """The OpenAPI document of `package` ("sink" or "publisher"), as stored."""
    return resources.files(package).joinpath(DOCUMENT).read_bytes()


def load_document(package: str) -> dict[str, Any]:
    """The OpenAPI document of `package`, parsed."""
    document = json.loads(document_bytes(package))
    if not isinstance(document, dict):
        raise ValueError(f"{package}/{DOCUMENT} is not a JSON object")
    return document


def add_openapi_route(app: web.Application, package: str) -> None:
    """Serve `package`'s document at GET (and HEAD) /openapi.json."""
    body = document_bytes(package)

    async def get_openapi(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json", charset="utf-8")

    app.router.add_get(OPENAPI_PATH, get_openapi)
