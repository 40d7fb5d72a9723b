"""What the CDN server tests share: the signing keys, admin token and test blob, and
the ``make_cdn`` and ``cdn`` fixtures that serve the CDN's HTTP API from real uvicorn
on loopback over a fresh SQLite registry, with an httpx client for it.

``cdn`` is parametrized over two blob stores: a local one (blobs sent as a file by
``FileResponse``) and one without files (streamed from ``open()``, like S3). Both
fail the test if the server ever reads a whole blob. The fixtures (functions
``*_fixture``, so that a test's parameter does not shadow the import) are imported
into each test module that uses them, where pytest finds them; ``cdn`` needs
``make_cdn`` imported beside it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_cdn import create_app
from model_cdn.registry import Registry, SqliteRegistry
from shared import SigningKey, digest
from shared.server.store import BlobStore

from ._cdn import NoWholeReadLocalStore, StreamOnlyStore, make_manifest_doc, serve_in_thread

__all__ = [
    "ADMIN",
    "AUTH",
    "BLOB",
    "BLOB_DIGEST",
    "IMMUTABLE",
    "KEY",
    "OTHER_KEY",
    "Cdn",
    "cdn_fixture",
    "make_cdn_fixture",
    "publish",
]

KEY = SigningKey(bytes(range(32)))
OTHER_KEY = SigningKey(bytes(range(1, 33)))
ADMIN = "admin-s3cret"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
BLOB = bytes(range(256)) * 40  # 10240 bytes
BLOB_DIGEST = digest(BLOB)
IMMUTABLE = "public, max-age=31536000, immutable"


@dataclass
class Cdn:
    url: str
    client: httpx.Client
    registry: Registry
    store: BlobStore
    root: Path


@pytest.fixture(name="make_cdn")
def make_cdn_fixture(tmp_path: Path) -> Iterator[Callable[..., Cdn]]:
    """Starts CDN servers over a fresh SQLite registry; all stopped after the test."""
    with ExitStack() as stack:

        def make(store: str = "file", **options: Any) -> Cdn:
            root = tmp_path / f"cdn-{uuid.uuid4().hex[:8]}"
            registry = SqliteRegistry(root / "registry.db")
            stack.callback(registry.close)
            blobs: BlobStore = (
                NoWholeReadLocalStore(root / "blobs") if store == "file" else StreamOnlyStore()
            )
            options.setdefault("admin_token", ADMIN)
            app = create_app(registry=registry, store=blobs, **options)
            if app.state.sender is not None:  # its own MQTT link (``mqtt=``)
                stack.callback(app.state.sender.close)
            url = stack.enter_context(serve_in_thread(app))
            client = stack.enter_context(httpx.Client(base_url=url, timeout=30))
            return Cdn(url, client, registry, blobs, root)

        yield make


@pytest.fixture(name="cdn", params=["file", "stream"])
def cdn_fixture(request: pytest.FixtureRequest, make_cdn: Callable[..., Cdn]) -> Cdn:
    return make_cdn(request.param)


def publish(cdn: Cdn, version: int, blob: bytes = BLOB, name: str = "mnist") -> dict[str, Any]:
    assert cdn.client.put(f"/v1/blobs/{digest(blob)}", content=blob, headers=AUTH).status_code in (
        200,
        201,
    )
    doc = make_manifest_doc(KEY, name, version, blob)
    response = cdn.client.post(f"/v1/models/{name}/versions", json=doc, headers=AUTH)
    assert response.status_code == 201, response.text
    return doc
