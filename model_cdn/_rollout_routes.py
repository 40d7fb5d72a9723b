"""Admin HTTP API for rollouts and the fleet (``tandem rollout …``, ``tandem fleet list``).

::

    POST /v1/rollouts                       start one (body: model, version, waves, gates…)
    GET  /v1/rollouts                       every rollout, newest first
    GET  /v1/rollouts/{id}                  one rollout's status
    POST /v1/rollouts/{id}/{command}        pause | resume | abort | rollback
    GET  /v1/devices?label=k=v&model=m&version=n
    GET  /v1/devices/{id}

Every route needs the admin token or an API key with ``rollout:admin``. The
rollout routes answer 503 when the server runs without a controller (no
``--broker`` or no ``--sign-key``); the device routes then read the fleet
as last written to the registry.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Query, Request
from starlette.concurrency import run_in_threadpool

from .fleet._view import device_view, label_filter
from .registry import Registry
from .registry._rows import check_name

if TYPE_CHECKING:
    from .rollout._controller import RolloutController

__all__ = ["add_rollout_routes"]

_COMMANDS = ("pause", "resume", "abort", "rollback")
_NO_CONTROLLER = (
    "rollouts are off on this server: start 'tandem cdn serve' with --broker and --sign-key"
)


def add_rollout_routes(
    app: FastAPI,
    *,
    controller: RolloutController | None,
    registry: Registry,
    dependencies: list[Any],
    read_json: Any,
    http_error: type[Exception],
) -> None:
    """Mount the routes on ``app`` behind ``dependencies`` (the rollout:admin guard)."""

    def need() -> RolloutController:
        if controller is None:
            raise http_error(503, _NO_CONTROLLER)
        return controller

    @app.post("/v1/rollouts", dependencies=dependencies, status_code=201)
    async def start_rollout(request: Request) -> dict[str, Any]:
        c = need()
        body = await read_json(request)
        return await run_in_threadpool(c.create, body)

    @app.get("/v1/rollouts", dependencies=dependencies)
    def list_rollouts() -> dict[str, Any]:
        return {"rollouts": need().rollouts()}

    @app.get("/v1/rollouts/{rollout_id}", dependencies=dependencies)
    def get_rollout(rollout_id: str) -> dict[str, Any]:
        return need().get(rollout_id)

    @app.post("/v1/rollouts/{rollout_id}/{command}", dependencies=dependencies)
    def rollout_command(rollout_id: str, command: str) -> dict[str, Any]:
        c = need()
        if command not in _COMMANDS:
            raise http_error(404, f"no rollout command {command!r:.40}: use {', '.join(_COMMANDS)}")
        return c.command(rollout_id, command)

    @app.get("/v1/devices", dependencies=dependencies)
    def list_devices(
        label: list[str] = Query(default=[]),  # noqa: B008 - FastAPI's declaration style
        model: str | None = None,
        version: int | None = None,
    ) -> dict[str, Any]:
        try:
            labels = label_filter(label)
        except ValueError as e:
            raise http_error(400, str(e)) from e
        if model is not None:
            check_name(model, "model name")
        if version is not None and model is None:
            raise http_error(400, "version needs model")
        now = time.time()
        if controller is not None:
            records = controller.devices(labels, model, version)
        else:
            from .fleet._view import FleetView

            records = FleetView(registry.list_devices()).select(labels, model, version)
        return {"devices": [device_view(r, now) for r in records]}

    @app.get("/v1/devices/{device}", dependencies=dependencies)
    def get_device(device: str) -> dict[str, Any]:
        check_name(device, "device id")
        record = controller.device(device) if controller is not None else None
        if record is None:
            record = registry.get_device(device)  # DeviceNotFoundError: 404
        return device_view(record, time.time())
