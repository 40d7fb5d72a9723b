"""Admin HTTP API for rollouts and the fleet (``tandem rollout …``, ``tandem fleet list``).

::

    POST rollouts                  start one (body: model, version, waves, gates…) -> 201,
                                   with "plan" (what each wave can decide); "dry_run": true
                                   answers the plan only (200); a plan with a wave that cannot
                                   decide before the max soak is 400 unless
                                   "accept_inconclusive": true
    GET  rollouts                  every rollout, newest first
    GET  rollout                   one rollout's status
    POST rollout_command           pause | resume | abort | rollback | skip-gate
                                   (skip-gate body: {"confirm": true, "reason": "…"}, else 400)
    GET  devices                   ?label=k=v&model=m&version=n
    GET  device                    one device
    POST fleet_labels              the operator's labels: {"devices": {id: {k: v}}}

(route names are keys of ``shared.CdnPaths.ROUTES``). Every route needs the
admin token or an API key with ``rollout:admin``. The rollout routes answer
503 when the server runs without a controller (no ``--broker`` or no
``--sign-key``); the device routes then read the fleet as last written to
the registry. Every command and start is recorded in the rollout's
``history`` with who asked: ``key <id>`` for an API key, ``admin token``
otherwise.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from shared import CdnPaths, InvalidApiKeyError
from shared.server import looks_like_api_key, parse_api_key

from ..fleet._view import FleetView, device_view, label_filter, label_map
from ..registry import Registry
from ..registry._rows import check_name
from ._auth import Guards
from ._bodies import read_json
from ._errors import HttpError

if TYPE_CHECKING:
    from ..rollout._controller import RolloutController

__all__ = ["add_rollout_routes", "caller", "command_args"]

ROUTES = CdnPaths.ROUTES
_COMMANDS = ("pause", "resume", "abort", "rollback", "skip-gate")
_MAX_REASON = 500
_NO_CONTROLLER = (
    "rollouts are off on this server: start 'tandem cdn serve' with --broker and --sign-key"
)


def caller(request: Request) -> str:
    """Who sent an (already authorized) admin request, for a rollout's history."""
    _, _, token = (request.headers.get("authorization") or "").partition(" ")
    token = token.strip()
    if looks_like_api_key(token):
        try:
            return f"key {parse_api_key(token)[0]}"
        except InvalidApiKeyError:  # the guard let it in, so it parses; never a crash here
            return "API key"
    return "admin token"


async def command_args(request: Request, command: str) -> dict[str, Any]:
    """What a command carries: who asked; for skip-gate, the confirmed reason (else 400)."""
    args: dict[str, Any] = {"by": caller(request)}
    if command != "skip-gate":
        return args
    body = await read_json(request)
    if body.get("confirm") is not True:
        raise HttpError(
            400,
            "skipping a gate lets the wave go on without its health judgement: "
            'send {"confirm": true, "reason": "..."} to do it',
        )
    reason = body.get("reason")
    if not isinstance(reason, str) or not reason.strip() or len(reason) > _MAX_REASON:
        raise HttpError(400, f"'reason' says why the gate is skipped (1-{_MAX_REASON} chars)")
    return {**args, "reason": reason.strip()}


class _RolloutRoutes:
    def __init__(self, controller: RolloutController | None, registry: Registry) -> None:
        self.controller, self.registry = controller, registry

    def _need(self) -> RolloutController:
        if self.controller is None:
            raise HttpError(503, _NO_CONTROLLER)
        return self.controller

    async def start_rollout(self, request: Request) -> Any:
        c = self._need()
        body = {**await read_json(request), "by": caller(request)}
        answer = await run_in_threadpool(c.create, body)
        if answer.get("dry_run"):
            return JSONResponse(answer, status_code=200)  # nothing was created
        return answer

    def list_rollouts(self) -> dict[str, Any]:
        return {"rollouts": self._need().rollouts()}

    def get_rollout(self, rollout_id: str) -> dict[str, Any]:
        return self._need().get(rollout_id)

    async def rollout_command(
        self, request: Request, rollout_id: str, command: str
    ) -> dict[str, Any]:
        c = self._need()
        if command not in _COMMANDS:
            raise HttpError(404, f"no rollout command {command!r:.40}: use {', '.join(_COMMANDS)}")
        args = await command_args(request, command)
        return await run_in_threadpool(c.command, rollout_id, command, args)

    def list_devices(
        self,
        label: list[str] = Query(default=[]),  # noqa: B008 - FastAPI's declaration style
        model: str | None = None,
        version: int | None = None,
    ) -> dict[str, Any]:
        try:
            labels = label_filter(label)
        except ValueError as e:
            raise HttpError(400, str(e)) from e
        if model is not None:
            check_name(model, "model name")
        if version is not None and model is None:
            raise HttpError(400, "version needs model")
        now = time.time()
        if self.controller is not None:
            records = self.controller.devices(labels, model, version)
        else:
            records = FleetView(self.registry.list_devices()).select(labels, model, version)
        return {"devices": [device_view(r, now) for r in records]}

    async def set_labels(self, request: Request) -> dict[str, Any]:
        try:
            labels = label_map(await read_json(request))
        except ValueError as e:
            raise HttpError(400, str(e)) from e
        now = time.time()
        if self.controller is not None:
            records = await run_in_threadpool(self.controller.set_labels, labels)
        else:
            fleet = FleetView(self.registry.list_devices())
            records = [fleet.set_labels(d, v, now) for d, v in labels.items()]
            await run_in_threadpool(self.registry.upsert_devices, records)
        return {"devices": [device_view(r, now) for r in records]}

    def get_device(self, device: str) -> dict[str, Any]:
        check_name(device, "device id")
        record = self.controller.device(device) if self.controller is not None else None
        if record is None:
            record = self.registry.get_device(device)  # DeviceNotFoundError: 404
        return device_view(record, time.time())


def add_rollout_routes(
    app: FastAPI, controller: RolloutController | None, registry: Registry, guards: Guards
) -> None:
    """The routes behind the rollout:admin guard."""
    routes = _RolloutRoutes(controller, registry)
    add, need = app.router.add_api_route, guards.rollout
    add(
        ROUTES["rollouts"],
        routes.start_rollout,
        methods=["POST"],
        dependencies=need,
        status_code=201,
    )
    add(ROUTES["rollouts"], routes.list_rollouts, methods=["GET"], dependencies=need)
    add(ROUTES["rollout"], routes.get_rollout, methods=["GET"], dependencies=need)
    add(ROUTES["rollout_command"], routes.rollout_command, methods=["POST"], dependencies=need)
    add(ROUTES["devices"], routes.list_devices, methods=["GET"], dependencies=need)
    add(ROUTES["device"], routes.get_device, methods=["GET"], dependencies=need)
    add(ROUTES["fleet_labels"], routes.set_labels, methods=["POST"], dependencies=need)
