"""Triton's statistics and model repository extensions on the hub's HTTP API.

Routes (all under ``/v2``, all behind the ``rollout:admin`` scope when API keys
are on, see ``_auth``)::

    GET  /v2/models/stats                               every served model's statistics
    GET  /v2/models/{name}[/versions/{v}]/stats         one model's (404 if not served)
    GET|POST /v2/repository/index                       [{name, version, state, reason}];
                                                        body {"ready": true}: the ready ones
    POST /v2/repository/models/{name}/load|unload       400: not supported

The statistics are Triton's JSON (``_statistics``), over what the hub already
counts (``ModelCounts``). Load and unload are refused with 400, as Triton
refuses them when its model control mode is not explicit, with a message
saying what the hub does instead: it serves what its model repository holds
and swaps a new version in, without a restart, when the repository changes;
an explicit load that kept the old version serving until the new one is
ready is not built.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .._dispatch import Dispatcher
from ..metrics import ModelCounts
from ._errors import error_response
from ._statistics import model_stats

__all__ = ["add_repository_routes", "repository_index"]

_NOT_SUPPORTED = (
    "{action} is not supported: the hub serves what its model repository holds and swaps "
    "in a new version without a restart when the repository changes; supported here are "
    "GET /v2/models[/{{name}}]/stats and POST /v2/repository/index"
)


def add_repository_routes(
    router: APIRouter,
    dispatcher: Dispatcher,
    statistics: Callable[[str, str], ModelCounts] | None,
) -> None:
    """Add the routes above to the ``/v2`` router, over ``dispatcher``; ``statistics``
    gives a version's counts. Added to that router itself, not included as one of its
    own: ``_auth`` reads the route's full template."""

    def stats_of(names: list[str], version: str | None) -> Any:
        if statistics is None:
            return error_response(501, "this hub does not count statistics")
        entries = []
        for name in names:
            info = dispatcher.describe(name, version)  # unknown model or version: 404
            entries.append(model_stats(statistics(info.model, info.version)))
        return {"model_stats": entries}

    async def all_stats() -> Any:
        return stats_of(sorted(dispatcher.model_names()), None)

    async def one_stats(model_name: str) -> Any:
        return stats_of([model_name], None)

    async def version_stats(model_name: str, model_version: str) -> Any:
        return stats_of([model_name], model_version)

    async def index(request: Request) -> Any:
        body = await request.body()
        ready_only = False
        if body.strip():
            try:
                parsed = json.loads(body)
            except ValueError:
                return error_response(400, "the index request's body must be JSON")
            if not isinstance(parsed, dict) or not isinstance(parsed.get("ready", False), bool):
                return error_response(400, 'the index request\'s body is {"ready": true|false}')
            ready_only = parsed.get("ready", False)
        return JSONResponse(repository_index(dispatcher, ready_only=ready_only))

    def refuse(action: str) -> Callable[[str], Any]:
        async def handler(model_name: str) -> Any:
            return error_response(400, _NOT_SUPPORTED.format(action=action))

        return handler

    router.add_api_route("/models/stats", all_stats, methods=["GET"])
    router.add_api_route("/models/{model_name}/stats", one_stats, methods=["GET"])
    router.add_api_route(
        "/models/{model_name}/versions/{model_version}/stats", version_stats, methods=["GET"]
    )
    for method in ("GET", "POST"):  # one route each: OpenAPI wants one operation id each
        router.add_api_route("/repository/index", index, methods=[method],
                             operation_id=f"repository_index_{method.lower()}")  # fmt: skip
    for action in ("load", "unload"):
        router.add_api_route(
            f"/repository/models/{{model_name}}/{action}",
            refuse(f"POST /v2/repository/models/{{name}}/{action}"),
            methods=["POST"],
        )


def repository_index(dispatcher: Dispatcher, *, ready_only: bool = False) -> list[dict[str, str]]:
    """Triton's repository index of what ``dispatcher`` serves: name, version, state, reason
    (also the gRPC API's RepositoryIndex)."""
    entries = []
    for name in sorted(dispatcher.model_names()):
        info = dispatcher.describe(name, None)
        ready = dispatcher.model_ready(name, None)
        if ready_only and not ready:
            continue
        entries.append(
            {
                "name": info.model,
                "version": info.version,
                "state": "READY" if ready else "LOADING",
                "reason": "" if ready else "loading or warming up",
            }
        )
    return entries
