"""REST routes of the model repository extension (MLServer's and Triton's paths).

POST /v2/repository/index (body optional: {"ready": true}) lists the models, loaded or not;
POST /v2/repository/models/{model_name}/load (re)loads one; .../unload unloads it. Load and unload
hand the request's ``Authorization`` header to the DataPlane, which needs the management key
there unless ``repository_token_auth`` is off; the index is read-only and open.
"""

from __future__ import annotations

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from runtime.core.dataplane import DataPlane
from runtime.errors import InvalidInput, PayloadTooLarge
from runtime.frontends.rest.codec import dumps, validation_message
from runtime.types import RepositoryIndexRequest

_MAX_BODY = 64 * 1024


async def _small_body(request: Request) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > _MAX_BODY:
            raise PayloadTooLarge(f"A repository request body is at most {_MAX_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def repository_routes(dataplane: DataPlane) -> list[BaseRoute]:
    async def index(request: Request) -> Response:
        body = await _small_body(request)
        ready = False
        if body.strip():
            try:
                ready = bool(RepositoryIndexRequest.model_validate_json(body).ready)
            except ValidationError as exc:
                raise InvalidInput(validation_message(exc)) from None
        items = await dataplane.repository_index(ready_only=ready)
        return Response(
            dumps([item.model_dump(mode="json", exclude_none=True) for item in items]),
            media_type="application/json",
        )

    async def load(request: Request) -> Response:
        authorization = request.headers.get("authorization")
        await dataplane.repository_load(request.path_params["model_name"], authorization)
        return Response(status_code=200)

    async def unload(request: Request) -> Response:
        authorization = request.headers.get("authorization")
        await dataplane.repository_unload(request.path_params["model_name"], authorization)
        return Response(status_code=200)

    return [
        Route("/v2/repository/index", index, methods=["POST"]),
        Route("/v2/repository/models/{model_name}/load", load, methods=["POST"]),
        Route("/v2/repository/models/{model_name}/unload", unload, methods=["POST"]),
    ]
