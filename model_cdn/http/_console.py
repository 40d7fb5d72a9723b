"""The fleet console: a web page served by ``tandem cdn serve``, and the JSON it reads.

::

    GET  /console/                        the page (static: HTML, CSS, one script; no data)
    GET  /console/api/whoami              what the caller's key may do: {"read", "act"}
    GET  /console/api/overview            the fleet by site, model and version; rollouts; models
    GET  /console/api/devices             one page of devices, filtered (``_console_devices``)
    GET  /console/api/rollouts/{id}       one rollout's status, gate judgements and their history,
                                          each cohort counted once (``_console_gates``)
    GET  /console/api/models/{name}       every version's manifest: sizes, deltas, quantization
    POST /console/api/rollouts/{id}/{command}   pause | resume | abort | rollback | skip-gate
                                          (skip-gate: {"confirm": true, "reason": "…"})

Access is the API's (``_auth``): the page is open (it holds nothing), every
read needs the read token, the admin token, or a key with ``models:read``
(or ``rollout:admin``), and every action needs the admin token or a key with
``rollout:admin``. When no read token and no keys are set, reads need the
admin token: fleet data is never anonymous. The page keeps the key the
person typed in the tab's ``sessionStorage`` and sends it as
``Authorization: Bearer``; it polls every two seconds (no server push, no
build step: the script is plain JavaScript shipped as package data).
"""

from __future__ import annotations

import time
from collections import Counter
from importlib import resources
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from shared import CdnPaths

from .._errors import AuthDenied
from ..fleet._view import DEFAULT_ONLINE_S, FleetView
from ..registry import Registry
from ..registry._rows import check_name
from ._auth import CdnAuth
from ._console_devices import DeviceQuery, device_page
from ._console_gates import with_cohorts
from ._errors import HttpError
from ._rollouts import command_args

if TYPE_CHECKING:
    from ..rollout._controller import RolloutController

__all__ = ["CONSOLE_ASSETS", "add_console_routes"]

CONSOLE_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
_COMMANDS = ("pause", "resume", "abort", "rollback", "skip-gate")
_SECURITY = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _asset(name: str) -> bytes:
    return resources.files("model_cdn.console").joinpath(name).read_bytes()


class _Console:
    def __init__(
        self, auth: CdnAuth, controller: RolloutController | None, registry: Registry
    ) -> None:
        self.auth, self.controller, self.registry = auth, controller, registry

    # -- who may do what ----------------------------------------------------------------

    def _can_act(self, header: str | None) -> bool:
        try:
            self.auth.require_admin(header, "rollout:admin")
        except AuthDenied as e:
            if e.status == 429:
                raise
            return False
        return True

    def read(self, request: Request) -> None:
        header = request.headers.get("authorization")
        if self.auth.read_token is None and self.auth.api_keys is None:
            self.auth.require_admin(header, "rollout:admin")
            return
        try:
            self.auth.require_read(header)
        except AuthDenied as e:
            if e.status != 403 or not self._can_act(header):
                raise

    def act(self, request: Request) -> None:
        self.auth.require_admin(request.headers.get("authorization"), "rollout:admin")

    # -- the page -----------------------------------------------------------------------

    @staticmethod
    def page(asset: str = "index.html") -> Response:
        if asset not in CONSOLE_ASSETS:
            raise HttpError(404, f"no console file {asset!r:.40}")
        return Response(_asset(asset), media_type=CONSOLE_ASSETS[asset], headers=_SECURITY)

    # -- reads --------------------------------------------------------------------------

    def whoami(self, request: Request) -> dict[str, Any]:
        self.read(request)
        return {"read": True, "act": self._can_act(request.headers.get("authorization"))}

    def _fleet(self) -> FleetView:
        if self.controller is not None:
            return FleetView([r for r in self.controller.devices()])
        return FleetView(self.registry.list_devices())

    def _rollouts(self) -> list[dict[str, Any]]:
        return self.controller.rollouts() if self.controller is not None else []

    def overview(self, request: Request) -> dict[str, Any]:
        self.read(request)
        now = time.time()
        fleet = self._fleet()
        sites: dict[str, dict[str, Any]] = {}
        for record in fleet.devices.values():
            site = record.labels.get("site", "(no site)")
            s = sites.setdefault(site, {"devices": 0, "online": 0, "versions": Counter()})
            s["devices"] += 1
            s["online"] += int(record.last_seen > 0 and now - record.last_seen <= DEFAULT_ONLINE_S)
            for model, version in record.models.items():
                s["versions"][f"{model}@{version}"] += 1
        models = []
        for name in self.registry.list_models():
            versions = [v.version for v in self.registry.list_versions(name)]
            models.append({"name": name, "versions": versions})
        rollouts = [
            {k: r.get(k) for k in _SUMMARY} | {"waiting": r.get("waiting")}
            for r in self._rollouts()
        ]
        return {
            "now": now,
            "devices": len(fleet),
            "online": sum(s["online"] for s in sites.values()),
            "sites": {k: {**v, "versions": dict(v["versions"])} for k, v in sorted(sites.items())},
            "rollouts": rollouts,
            "models": models,
            "rollouts_enabled": self.controller is not None,
        }

    def devices(self, request: Request) -> dict[str, Any]:
        self.read(request)
        try:
            query = DeviceQuery.parse(request.query_params.multi_items())
        except ValueError as e:
            raise HttpError(400, str(e)) from e
        fleet = self._fleet()
        return device_page(fleet.devices.values(), query, time.time(), len(fleet))

    def rollout(self, request: Request, rollout_id: str) -> dict[str, Any]:
        self.read(request)
        if self.controller is None:
            raise HttpError(503, "rollouts are off on this server")
        return with_cohorts(self.controller.get(rollout_id))

    def model(self, request: Request, name: str) -> dict[str, Any]:
        self.read(request)
        check_name(name, "model name")
        versions = []
        for v in self.registry.list_versions(name):
            signed = v.manifest.get("signed", {})
            versions.append(
                {
                    "version": v.version,
                    "published_at": v.published_at,
                    "blob_digest": v.blob_digest,
                    "manifest": {k: signed.get(k) for k in _MANIFEST if k in signed},
                }
            )
        if not versions:
            raise HttpError(404, f"no model {name!r:.60}")
        return {"name": name, "versions": versions}

    # -- actions ------------------------------------------------------------------------

    async def command(self, request: Request, rollout_id: str, command: str) -> dict[str, Any]:
        self.act(request)
        if self.controller is None:
            raise HttpError(503, "rollouts are off on this server")
        if command not in _COMMANDS:
            raise HttpError(404, f"no rollout command {command!r:.40}")
        args = await command_args(request, command)  # who; skip-gate's confirmed reason
        return await run_in_threadpool(self.controller.command, rollout_id, command, args)


_SUMMARY = (
    "id",
    "model",
    "version",
    "previous_version",
    "state",
    "reason",
    "wave",
    "waves_total",
    "counts",
    "failure_rate",
    "created_at",
    "target",
)
_MANIFEST = (
    "format",
    "requires",
    "inputs",
    "outputs",
    "blob",
    "deltas",
    "quantization",
    "labels",
    "published_at",
    "expires_at",
)


def add_console_routes(
    app: FastAPI, auth: CdnAuth, controller: RolloutController | None, registry: Registry
) -> None:
    """The console's page and its JSON routes (see the module docstring)."""
    c = _Console(auth, controller, registry)
    add, r = app.router.add_api_route, CdnPaths.ROUTES
    page = r["console_page"]
    add(
        r["console"],
        lambda: RedirectResponse(page, status_code=307),
        methods=["GET"],
        include_in_schema=False,
    )
    add(page, c.page, methods=["GET"], include_in_schema=False)
    add(r["console_asset"], c.page, methods=["GET"], include_in_schema=False)
    add(r["console_whoami"], c.whoami, methods=["GET"])
    add(r["console_overview"], c.overview, methods=["GET"])
    add(r["console_devices"], c.devices, methods=["GET"])
    add(r["console_rollout"], c.rollout, methods=["GET"])
    add(r["console_model"], c.model, methods=["GET"])
    add(r["console_command"], c.command, methods=["POST"])
