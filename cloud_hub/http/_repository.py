"""Triton's statistics and model repository extensions on the hub's HTTP API.

Routes (all under ``/v2``, all behind the ``rollout:admin`` scope when API keys
are on, see ``_auth``)::

    GET  /v2/models/stats                               every served model's statistics
    GET  /v2/models/{name}[/versions/{v}]/stats         one model's (404 if not served)
    GET|POST /v2/repository/index                       [{name, version, state, reason}];
                                                        body {"ready": true}: the ready ones
    POST /v2/repository/models/{name}/load              load it; body {"parameters":
                                                        {"version": "3"}} pins a version
    POST /v2/repository/models/{name}/unload            stop serving it

The statistics are Triton's JSON (``_statistics``), over what the hub already
counts (``ModelCounts``). Load and unload are served where the hub has a
``ModelController``: ``tandem hub``, whose supervisor starts the executors of
the version asked for (pulled from the CDN first with ``--cdn``, when the
repository lacks it), lets the version serving answer until they are ready,
then swaps (``cloud_hub.plane._model_control``). The answer comes when that is
done: 200, or 400 with why it could not be (the version serving keeps serving),
as Triton answers. A load without a version serves the repository's choice
(``default_version``, else the highest) and follows new versions again.
Triton's ``config`` and ``file:`` parameters (a model sent in the request) are
refused: put the version in the repository or on the CDN, then load it. The
embedded ``Hub`` has no controller: it answers 400, as Triton does when its
model control mode is not explicit, and swaps versions when its repository
changes. Language models are not loaded or unloaded (400): their executors
serve them from the start.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .._dispatch import Dispatcher
from ..metrics import ModelCounts
from ._errors import error_response
from ._statistics import model_stats

__all__ = [
    "LOAD_TIMEOUT_S",
    "ControlOutcome",
    "ModelController",
    "add_repository_routes",
    "repository_index",
]

LOAD_TIMEOUT_S = 600.0  # how long a load or unload request waits for the hub to do it
_ROUTED_S = 5.0  # then for this process to route by it (it reads the hub's choice every 0.25 s)


class ControlOutcome(Protocol):
    """What became of a load or unload (``cloud_hub.plane``'s ``ControlAnswer``)."""

    @property
    def ok(self) -> bool: ...
    @property
    def state(self) -> str: ...
    @property
    def version(self) -> str | None: ...
    @property
    def reason(self) -> str: ...


class ModelController(Protocol):
    """Who loads and unloads models for the API (the process plane's supervisor)."""

    async def request(
        self, model: str, action: str, version: str | None, *, timeout_s: float
    ) -> ControlOutcome | None: ...

    def unloaded(self) -> list[str]: ...


_NOT_SUPPORTED = (
    "{action} is not supported by the embedded Hub: it serves what its model repository "
    "holds and swaps in a new version without a restart when the repository changes "
    "(tandem hub serves load and unload)"
)


def add_repository_routes(
    router: APIRouter,
    dispatcher: Dispatcher,
    statistics: Callable[[str, str], ModelCounts] | None,
    control: ModelController | None = None,
    language: Callable[[], Iterable[str]] = tuple,
) -> None:
    """Add the routes above to the ``/v2`` router, over ``dispatcher``; ``statistics``
    gives a version's counts, ``control`` loads and unloads, ``language`` names the
    language models. Added to that router itself, not included as one of its own:
    ``_auth`` reads the route's full template."""

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
        unloaded = control.unloaded() if control is not None else []
        return JSONResponse(repository_index(dispatcher, ready_only=ready_only, unloaded=unloaded))

    def act(action: str) -> Callable[[str, Request], Any]:
        async def handler(model_name: str, request: Request) -> Any:
            if control is None:
                return error_response(400, _NOT_SUPPORTED.format(
                    action=f"POST /v2/repository/models/{{name}}/{action}"))  # fmt: skip
            if model_name in set(language()):
                return error_response(
                    400, f"{model_name} is a language model: its executor serves it from the "
                    "start, it is not loaded or unloaded")  # fmt: skip
            version = _version_asked(await request.body()) if action == "load" else None
            if isinstance(version, JSONResponse):
                return version
            try:
                outcome = await control.request(
                    model_name, action, version, timeout_s=LOAD_TIMEOUT_S
                )
            except ValueError as e:  # not a model name
                return error_response(400, str(e))
            if outcome is None:
                late = f"not done within {LOAD_TIMEOUT_S:.0f} s; the hub goes on with it"
                return error_response(503, f"{action} of {model_name} {late}")
            if not outcome.ok:
                return error_response(400, f"failed to {action} {model_name}: {outcome.reason}")
            # done where the executors are; answered once this process routes that way too
            deadline = time.monotonic() + _ROUTED_S
            while not _routed(dispatcher, model_name, outcome.version if action == "load"
                              else None) and time.monotonic() < deadline:  # fmt: skip
                await asyncio.sleep(0.02)
            return JSONResponse({})

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
            f"/repository/models/{{model_name}}/{action}", act(action), methods=["POST"]
        )


def repository_index(
    dispatcher: Dispatcher, *, ready_only: bool = False, unloaded: Iterable[str] = ()
) -> list[dict[str, str]]:
    """Triton's repository index of what ``dispatcher`` serves: name, version, state, reason
    (also the gRPC API's RepositoryIndex); ``unloaded`` models are listed UNAVAILABLE."""
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
    if not ready_only:
        served = set(dispatcher.model_names())
        entries += [
            {"name": name, "version": "", "state": "UNAVAILABLE", "reason": "unloaded"}
            for name in unloaded
            if name not in served
        ]
        entries.sort(key=lambda e: e["name"])
    return entries


def _routed(dispatcher: Dispatcher, model: str, version: str | None) -> bool:
    """Whether this process sends ``model``'s requests to ``version`` (None: to nothing)."""
    if version is None:
        return model not in dispatcher.model_names()
    return dispatcher.model_ready(model, None) and dispatcher.describe(model).version == version


def _version_asked(body: bytes) -> str | JSONResponse | None:
    """The version a load request's body pins (None: the repository's choice), or a 400."""
    if not body.strip():
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return error_response(400, "the load request's body must be JSON")
    parameters = parsed.get("parameters", {}) if isinstance(parsed, dict) else None
    if not isinstance(parameters, dict):
        return error_response(400, 'the load request\'s body is {"parameters": {...}}')
    sent = [k for k in parameters if k == "config" or k.startswith("file:")]
    if sent:
        return error_response(400, f"load parameter {sent[0]!r} is not supported: put the "
                              "version in the repository or on the CDN, then load it by "
                              'version ({"parameters": {"version": "3"}})')  # fmt: skip
    version = parameters.get("version")
    if version is None:
        return None
    if isinstance(version, bool) or not isinstance(version, int | str):
        return error_response(400, "parameter 'version' is a positive integer")
    text = str(version)
    if not text.isdecimal() or int(text) < 1 or len(text) > 18:
        return error_response(400, "parameter 'version' is a positive integer")
    return str(int(text))
