"""Root metadata for devices to walk: ``GET /v1/roots/{version}.root.json`` (``trust_repo``).

Served from the directory ``tandem keys`` writes (``create_app(trust_dir=…)``),
read on every request so a rotation needs no restart; 404 for a version not
there (which is how a device learns it holds the newest). Public like blobs:
the documents are signed and hold public keys only.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from shared import CdnPaths

from .._errors import HttpError
from ..trust_repo import TrustRepository
from ._auth import Guards
from ._bodies import parse_version

__all__ = ["add_root_routes"]


def add_root_routes(app: FastAPI, trust_dir: Path | None, guards: Guards) -> None:
    repository = None if trust_dir is None else TrustRepository(trust_dir)

    async def get_root(version: str) -> Response:
        number = parse_version(version)
        raw = None if repository is None else await run_in_threadpool(repository.read, number)
        if raw is None:
            raise HttpError(404, f"no root version {number}")
        return Response(raw, media_type="application/json", headers={"Cache-Control": "no-cache"})

    path = CdnPaths.ROUTES["root"].replace("{version}.root.json", "{version}")
    app.router.add_api_route(
        path + ".root.json", get_root, methods=["GET"], dependencies=guards.read
    )
