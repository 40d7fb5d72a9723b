"""Admin HTTP API for rollouts and the fleet (``tandem rollout …``, ``tandem fleet list``).

::

    POST rollouts                  start one (body: model, version, waves, gates…) -> 201
    GET  rollouts                  every rollout, newest first
    GET  rollout                   one rollout's status
    POST rollout_command           pause | resume | abort | rollback
    GET  devices                   ?label=k=v&model=m&version=n
    GET  device                    one device
    POST fleet_labels              the operator's labels: {"devices": {id: {k: v}}}

(route names are keys of ``shared.CdnPaths.ROUTES``). Every route needs the
admin token or an API key with ``rollout:admin``. The rollout routes answer
503 when the server runs without a controller (no ``--broker`` or no
``--sign-key``); the device routes then read the fleet as last written to
the registry.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Query, Request
from starlette.concurrency import run_in_threadpool

from shared import CdnPaths

from ..fleet._view import FleetView, device_view, label_filter, label_map
from ..registry import Registry
from ..registry._rows import check_name
from ._auth import Guards
from ._bodies import read_json
from ._errors import HttpError

if TYPE_CHECKING:
    from ..rollout._controller import RolloutController

__all__ = ["add_rollout_routes"]

ROUTES = CdnPaths.ROUTES
_COMMANDS = ("pause", "resume", "abort", "rollback")
_NO_CONTROLLER = (
    "rollouts are off on this server: start 'tandem cdn serve' with --broker and --sign-key"
)


class _RolloutRoutes:
    def __init__(self, controller: RolloutController | None, registry: Registry) -> None:
        self.controller, self.registry = controller, registry

    def _need(self) -> RolloutController:
        if self.controller is None:
            raise HttpError(503, _NO_CONTROLLER)
        return self.controller

    async def start_rollout(self, request: Request) -> dict[str, Any]:
        c = self._need()
        body = await read_json(request)
        return await run_in_threadpool(c.create, body)

    def list_rollouts(self) -> dict[str, Any]:
        return {"rollouts": self._need().rollouts()}

    def get_rollout(self, rollout_id: str) -> dict[str, Any]:
        return self._need().get(rollout_id)

    def rollout_command(self, rollout_id: str, command: str) -> dict[str, Any]:
        c = self._need()
        if command not in _COMMANDS:
            raise HttpError(404, f"no rollout command {command!r:.40}: use {', '.join(_COMMANDS)}")
        return c.command(rollout_id, command)

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
