"""Device assignments: which version a device should run, signed.

::

    GET  assignment   the signed assignment (devices poll it)        Cache-Control: no-cache
    PUT  assignment   [rollout:admin] body = signed assignment -> {device, model, version,
                      published}

A PUT goes through ``model_cdn.assign_version`` and the app's one
``AssignmentSender`` (the rollout controller's when there is one): stored,
then published retained over MQTT, waiting for the broker's PUBACK (502 and
"assignment stored, but not published" when it does not come). Without a
broker it is stored only (``published: false``); devices poll.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from shared import CdnPaths

from .._assignment_sender import AssignmentSender
from .._upload_trust import UploadTrust
from .._versions import assign_version
from ..registry import Registry
from ..registry._rows import check_name
from ._auth import Guards
from ._bodies import read_json
from ._errors import HttpError
from ._models import document_response

__all__ = ["add_assignment_routes"]


class _AssignmentRoutes:
    def __init__(
        self,
        registry: Registry,
        sender: AssignmentSender | None,
        trust: UploadTrust,
    ) -> None:
        self.registry, self.sender, self.trust = registry, sender, trust

    def get_assignment(self, device: str, model: str) -> Response:
        doc = self.registry.get_assignment(
            check_name(device, "device id"), check_name(model, "model name")
        )
        if doc is None:
            raise HttpError(404, f"no assignment of model {model} to device {device}")
        return document_response(doc, "no-cache")

    async def put_assignment(self, device: str, model: str, request: Request) -> Response:
        doc = await read_json(request)

        def assign() -> dict[str, Any]:
            result = assign_version(
                self.registry,
                self.sender,
                device,
                model,
                doc,
                trusted_keys=self.trust.current(),
                wait=True,
            )
            return result.to_dict()

        return JSONResponse(await run_in_threadpool(assign))


def add_assignment_routes(
    app: FastAPI,
    registry: Registry,
    sender: AssignmentSender | None,
    trust: UploadTrust,
    guards: Guards,
) -> None:
    routes = _AssignmentRoutes(registry, sender, trust)
    router = app.router
    path = CdnPaths.ROUTES["assignment"]
    router.add_api_route(path, routes.get_assignment, methods=["GET"], dependencies=guards.read)
    router.add_api_route(path, routes.put_assignment, methods=["PUT"], dependencies=guards.rollout)
