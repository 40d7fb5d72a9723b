"""Models, their versions and signed manifests: reads for devices, writes for publishers.

::

    GET    models              {"models": [name, …]}
    GET    versions            {"versions": [{version, blob_digest, published_at}]}
    GET    latest_manifest     the latest signed manifest        Cache-Control: no-cache
    GET    manifest            one version's signed manifest     Cache-Control: max-age=300
    POST   versions            [models:publish] body = signed manifest -> 201
    DELETE version             [models:publish]

(route names are keys of ``shared.CdnPaths.ROUTES``). Publishing and
withdrawing go through ``model_cdn._versions``, the same code as the CLI's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from shared import CdnPaths
from shared.server.store import BlobStore

from .._upload_trust import UploadTrust
from .._versions import add_version, delete_version
from ..registry import Registry
from ..registry._rows import check_name, dump_document
from ._auth import Guards
from ._bodies import parse_version, read_json

if TYPE_CHECKING:
    from .._metrics import CdnMetrics

__all__ = ["add_model_routes", "document_response"]

ROUTES = CdnPaths.ROUTES


def document_response(doc: dict[str, Any], cache: str) -> Response:
    """A signed document as stored, byte for byte, with its ``Cache-Control``."""
    return Response(
        dump_document(doc), media_type="application/json", headers={"Cache-Control": cache}
    )


class _ModelRoutes:
    def __init__(
        self,
        registry: Registry,
        store: BlobStore,
        metrics: CdnMetrics | None,
        trust: UploadTrust,
    ) -> None:
        self.registry, self.store, self.metrics = registry, store, metrics
        self.trust = trust

    def list_models(self) -> dict[str, Any]:
        return {"models": self.registry.list_models()}

    def list_versions(self, name: str) -> dict[str, Any]:
        records = self.registry.list_versions(check_name(name, "model name"))
        return {
            "versions": [
                {"version": r.version, "blob_digest": r.blob_digest, "published_at": r.published_at}
                for r in records
            ]
        }

    def latest_manifest(self, name: str) -> Response:
        record = self.registry.get_version(check_name(name, "model name"))
        if self.metrics is not None:
            self.metrics.manifest_served(name, record.version)
        return document_response(record.manifest, "no-cache")

    def manifest(self, name: str, version: str) -> Response:
        record = self.registry.get_version(check_name(name, "model name"), parse_version(version))
        if self.metrics is not None:
            self.metrics.manifest_served(name, record.version)
        # A version's manifest never changes, but it may be withdrawn: cache it briefly.
        return document_response(record.manifest, "public, max-age=300")

    async def add_version(self, name: str, request: Request) -> Response:
        check_name(name, "model name")
        doc = await read_json(request)

        def add() -> dict[str, Any]:
            record = add_version(
                self.registry, self.store, doc, trusted_keys=self.trust.current(), name=name
            )
            return {
                "name": record.name,
                "version": record.version,
                "blob_digest": record.blob_digest,
                "published_at": record.published_at,
            }

        return JSONResponse(await run_in_threadpool(add), status_code=201)

    def delete_version(self, name: str, version: str) -> dict[str, Any]:
        number = parse_version(version)
        delete_version(self.registry, name, number)
        return {"deleted": {"name": name, "version": number}}


def add_model_routes(
    app: FastAPI,
    registry: Registry,
    store: BlobStore,
    metrics: CdnMetrics | None,
    trust: UploadTrust,
    guards: Guards,
) -> None:
    routes = _ModelRoutes(registry, store, metrics, trust)
    router = app.router
    read, publish = guards.read, guards.publish
    router.add_api_route(ROUTES["models"], routes.list_models, methods=["GET"], dependencies=read)
    router.add_api_route(
        ROUTES["versions"], routes.list_versions, methods=["GET"], dependencies=read
    )
    router.add_api_route(
        ROUTES["latest_manifest"], routes.latest_manifest, methods=["GET"], dependencies=read
    )
    router.add_api_route(ROUTES["manifest"], routes.manifest, methods=["GET"], dependencies=read)
    router.add_api_route(
        ROUTES["versions"], routes.add_version, methods=["POST"], dependencies=publish
    )
    router.add_api_route(
        ROUTES["version"], routes.delete_version, methods=["DELETE"], dependencies=publish
    )
