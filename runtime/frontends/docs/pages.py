"""The API pages, as MLServer serves them: ``GET /v2/docs`` (Swagger UI) and ``/v2/docs/dataplane.json``
(the OpenAPI document), and the same for one model under ``/v2/models/{name}[/versions/{v}]/docs``.

Swagger UI's script and style come from the server itself (``/v2/docs/static/``), out of the
``swagger-ui-py`` package's copy of Swagger UI's distribution, never from a CDN: the pages work where
nothing else is reachable. The package's Python code is not imported, only its files are read.
"""

from __future__ import annotations

import functools
import html
import importlib.util
from pathlib import Path

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from runtime.core.dataplane import DataPlane
from runtime.frontends.docs.openapi import dataplane_document, model_document

ASSETS = {
    "swagger-ui.css": "text/css; charset=utf-8",
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "favicon-32x32.png": "image/png",
    "favicon-16x16.png": "image/png",
}
"""The files of Swagger UI's distribution that the page uses."""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<link rel="stylesheet" href="{static}/swagger-ui.css">
<link rel="icon" type="image/png" href="{static}/favicon-32x32.png" sizes="32x32">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{static}/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({{
  url: {document},
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis],
}});
</script>
</body>
</html>
"""


@functools.cache
def assets_folder() -> Path | None:
    """The folder of Swagger UI's files in the installed ``swagger-ui-py`` (None when it is not installed)."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "static"
    return folder if (folder / "swagger-ui-bundle.js").is_file() else None


def _json(document: object) -> Response:
    return Response(orjson.dumps(document), media_type="application/json")


def _page(request: Request, title: str) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    document = root + request.url.path.rstrip("/") + "/dataplane.json"
    text = _PAGE.format(
        title=html.escape(title),
        static=html.escape(root + "/v2/docs/static"),
        document=html.escape(orjson.dumps(document).decode(), quote=False),
    )
    return HTMLResponse(text)


def docs_routes(dataplane: DataPlane) -> list[BaseRoute]:
    """The routes of the API pages over ``dataplane``."""

    async def _model_document(request: Request) -> dict[str, object]:
        name = request.path_params["model_name"]
        version = request.path_params.get("model_version")
        meta = await dataplane.model_metadata(name, version)
        return model_document(meta, version)

    async def docs(request: Request) -> Response:
        return _page(request, "Data Plane: Swagger UI")

    async def document(request: Request) -> Response:
        return _json(dataplane_document())

    async def model_docs(request: Request) -> Response:
        await _model_document(request)  # 404 for a model that does not exist
        return _page(request, f"Model {request.path_params['model_name']}: Swagger UI")

    async def model_json(request: Request) -> Response:
        return _json(await _model_document(request))

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        folder = assets_folder()
        if name not in ASSETS or folder is None:
            raise HTTPException(404, f"No such file of the API pages: {name!r}")
        return FileResponse(
            folder / name, media_type=ASSETS[name], headers={"cache-control": "public, max-age=86400"}
        )

    model = "/v2/models/{model_name}"
    versioned = model + "/versions/{model_version}"
    return [
        Route("/v2/docs", docs, methods=["GET"]),
        Route("/v2/docs/dataplane.json", document, methods=["GET"]),
        Route("/v2/docs/static/{name}", asset, methods=["GET"]),
        Route(model + "/docs", model_docs, methods=["GET"]),
        Route(model + "/docs/dataplane.json", model_json, methods=["GET"]),
        Route(versioned + "/docs", model_docs, methods=["GET"]),
        Route(versioned + "/docs/dataplane.json", model_json, methods=["GET"]),
    ]
