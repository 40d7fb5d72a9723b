"""Helpers for the model CDN tests: signed documents, a uvicorn server in a thread,
a PostgreSQL database of the tests' own, and blob stores with and without a file path.
"""

from __future__ import annotations

import io
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

from model_cdn import BlobNotFoundError
from shared import (
    Assignment,
    BlobRef,
    ModelManifest,
    MqttSettings,
    SigningKey,
    create_client,
    digest,
    format_time,
    sign_document,
)
from shared.server.store import BlobStore, LocalBlobStore

__all__ = [
    "PG_ADMIN_URL",
    "NoWholeReadLocalStore",
    "RecordingLink",
    "StreamOnlyStore",
    "files_under",
    "make_assignment_doc",
    "make_manifest_doc",
    "postgres_available",
    "postgres_database",
    "receive_retained",
    "serve_in_thread",
]

PG_ADMIN_URL = os.environ.get(
    "TANDEM_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)
NOW = datetime.now(UTC).replace(microsecond=0)


def make_manifest_doc(
    key: SigningKey, name: str, version: int, blob: bytes = b"model bytes", **extra: Any
) -> dict[str, Any]:
    manifest = ModelManifest(
        name=name,
        version=version,
        format="onnx",
        blob=BlobRef(digest(blob), len(blob), len(blob), "none"),
        published_at=format_time(NOW),
        expires_at=format_time(NOW + timedelta(days=30)),
        quantization={"method": "none", "agreement": 1.0},
        extra=extra,
    )
    return sign_document(manifest.to_dict(), key)


def make_assignment_doc(
    key: SigningKey, device: str, model: str, version: int, *, rollback: bool = False
) -> dict[str, Any]:
    assignment = Assignment(
        device=device,
        model=model,
        version=version,
        rollback=rollback,
        issued_at=format_time(NOW),
        expires_at=format_time(NOW + timedelta(days=1)),
    )
    return sign_document(assignment.to_dict(), key)


class RecordingLink:
    """An ``AssignmentLink`` that keeps what it was given: (device, document, wait_s).

    For tests of the controller's decisions without a broker; the MQTT path
    itself is tested against real Mosquitto (test_assignment_sender.py).
    """

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], float | None]] = []

    def publish_retained(
        self, device: str, document: Mapping[str, Any], *, wait_s: float | None = None
    ) -> None:
        self.sent.append((device, dict(document), wait_s))

    @property
    def published(self) -> list[tuple[str, dict[str, Any]]]:
        return [(device, doc) for device, doc, _wait in self.sent]

    def clear(self) -> None:
        self.sent.clear()


class StreamOnlyStore(BlobStore):
    """Blobs in memory with no file path (like S3): the server must stream ``open()``.

    ``get`` (the whole blob at once) fails the test if the server ever calls it;
    ``reads`` records the size of each read the server asks of an opened stream.
    """

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.reads: list[int] = []

    def _put(self, digest: str, data: bytes) -> None:
        self.blobs[digest] = data

    def _get(self, digest: str) -> bytes:
        raise AssertionError("the server read a whole blob into memory")

    def _open(self, digest: str) -> BinaryIO:
        if digest not in self.blobs:
            raise BlobNotFoundError(f"no blob {digest}")
        store = self

        class Recording(io.BytesIO):
            def read(self, size: int | None = -1) -> bytes:
                store.reads.append(-1 if size is None else size)
                return super().read(size)

        return Recording(self.blobs[digest])

    def _exists(self, digest: str) -> bool:
        return digest in self.blobs

    def _size(self, digest: str) -> int:
        if digest not in self.blobs:
            raise BlobNotFoundError(f"no blob {digest}")
        return len(self.blobs[digest])

    def _delete(self, digest: str) -> None:
        self.blobs.pop(digest, None)


class NoWholeReadLocalStore(LocalBlobStore):
    """A ``LocalBlobStore`` whose ``get``/``open`` fail the test: files go out by path."""

    def _get(self, digest: str) -> bytes:
        raise AssertionError("the server read a whole blob into memory")

    def _open(self, digest: str) -> BinaryIO:
        raise AssertionError("the server opened a local blob instead of sending its file")


@contextmanager
def serve_in_thread(
    app: Any, ssl: dict[str, Any] | None = None, *, port: int = 0, lifespan: str = "off"
) -> Iterator[str]:
    """Run ``app`` with real uvicorn on a loopback port (a free one by default); yields its URL.

    ``ssl``: uvicorn's ``ssl_*`` options (``ssl_certfile`` …): it then serves HTTPS.
    ``lifespan="on"`` runs the app's startup and shutdown as ``uvicorn.run`` would.
    """
    import uvicorn

    # IPPROTO_TCP, not socket()'s 0: asyncio turns Nagle off only on connections
    # accepted from a socket whose proto says TCP (as uvicorn.run(host, port) makes).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan=lifespan, **(ssl or {}))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        yield f"{'https' if ssl else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh database on the test PostgreSQL, dropped afterwards; yields its URL."""
    import psycopg

    name = f"tandem_cdn_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postgres_available() -> str | None:
    """Why PostgreSQL cannot be used here, or None when it can."""
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return None
    except Exception as e:  # any reason at all means: skip, and say why
        return f"no PostgreSQL at {PG_ADMIN_URL}: {str(e).strip().splitlines()[0]}"


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def receive_retained(url: str, topic: str) -> Any:
    """Connect a fresh subscriber and return the first message on ``topic``."""
    client = create_client(
        MqttSettings.from_url(url), f"test-sub-{uuid.uuid4().hex[:8]}", protocol="3.1.1"
    )
    messages: queue.Queue[Any] = queue.Queue()
    client.on_connect = lambda c, _u, _f, _rc, _p: c.subscribe(topic, qos=1)
    client.on_message = lambda _c, _u, message: messages.put(message)
    client.connect("127.0.0.1", MqttSettings.from_url(url).port)
    client.loop_start()
    try:
        return messages.get(timeout=15)
    finally:
        client.disconnect()
        client.loop_stop()
