"""The demo's edge model, delivered the way a fleet gets one: published, served, installed.

``deliver_edge_model`` plays the operator and the fleet on this machine:

1. a throwaway publisher key (ed25519), pinned on every simulated device;
2. ``model_cdn.publish_model`` on the float edge model: INT8 static
   quantization, validation against the float model on the test digits (the
   publish gate), zstd, a signed manifest, into a temporary SQLite registry
   and local blob store;
3. one signed assignment per device (``make_assignment``) in the registry;
4. the CDN's HTTP API (``model_cdn.create_app``) on a free loopback port;
5. on each device, the real ``edge_agent.updater.ModelUpdater`` installing
   its first model from that CDN (``check_now``: the assignment and manifest
   verified against the pinned key, the blob's digest checked, the smoke
   test run, the version stored atomically and committed), swapped into an
   agent that has no local model yet, as a fresh device runs cloud-only
   until its first install.

The CDN is stopped before this returns; the device stores stay in
``workdir``. The demo's agents then start on what their store re-verifies
(``EdgeDelivery.runtime``, i.e. ``ModelUpdater.bootstrap``), as a device
does after a restart. Any failure on the way is a ``DeliveryError`` naming
the step; nothing here prints.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent import EdgeAgent, EdgeError
from edge_agent.updater import DeviceModelStore, ModelUpdater
from model_cdn import CdnError, LocalBlobStore, make_assignment, open_registry
from model_cdn.registry import Registry
from shared import (
    ModelManifest,
    MqttSettings,
    PublicKey,
    SigningKey,
    StoreError,
    Topics,
    UpdateState,
    canonical_json,
    digest,
)

from ._errors import DeliveryError
from .data import DigitSplits
from .models import QUANTIZATION

if TYPE_CHECKING:
    from edge_agent.runtimes import ModelRuntime
    from model_cdn import PublishResult

__all__ = ["EDGE_MODEL", "DeviceInstall", "EdgeDelivery", "deliver_edge_model", "manifest_digest"]

EDGE_MODEL = "mnist-edge"  # the edge model's name in the CDN (the hub serves "mnist")
_ASSIGNMENT_TTL_DAYS = 1.0  # the demo's assignments outlive the demo, and no more

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class DeviceInstall:
    """One device's first install, as its updater reported it and its store holds it."""

    device: str
    state: str  # the updater's last report ("installed" when it worked)
    version: int  # the committed version the store now serves
    manifest_digest: str  # of the signed manifest the device verified and stored
    downloaded_bytes: int  # blob bytes the updater read from the CDN
    store_dir: Path


@dataclass(frozen=True)
class EdgeDelivery:
    """What was published, where it was served from, and what each device installed."""

    model: str
    version: int
    manifest_digest: str  # sha256 of the manifest's canonical signed form
    blob_digest: str
    blob_bytes: int  # compressed: what each device downloads
    model_bytes: int  # the INT8 ONNX file it unpacks to
    model_digest: str | None  # sha256 of that file, as the manifest signs it
    agreement: float  # INT8 vs float on the validation digits (the publish gate)
    cdn_url: str  # where the CDN was served (stopped once the devices installed)
    trusted_keys: tuple[PublicKey, ...]
    devices: tuple[DeviceInstall, ...]

    @property
    def label(self) -> str:
        """``name@version``, as ``InferenceResult.model_versions`` names the edge model."""
        return f"{self.model}@{self.version}"

    def runtime(self, device: str) -> ModelRuntime:
        """``device``'s model as it (re)starts: the version its store re-verifies."""
        install = next((d for d in self.devices if d.device == device), None)
        if install is None:
            raise DeliveryError(f"device {device!r} took no part in the delivery")
        runtime = ModelUpdater.bootstrap(install.store_dir, self.trusted_keys, self.model)
        if runtime is None:
            raise DeliveryError(f"{device}: the store has no verified {self.model} to serve")
        return runtime

    def to_dict(self) -> dict[str, Any]:
        """The report's ``delivery`` section (JSON types only)."""
        return {
            "model": self.model,
            "version": self.version,
            "manifest_digest": self.manifest_digest,
            "blob_digest": self.blob_digest,
            "blob_bytes": self.blob_bytes,
            "model_bytes": self.model_bytes,
            "model_digest": self.model_digest,
            "agreement": self.agreement,
            "cdn_url": self.cdn_url,
            "publisher_keys": [key.keyid for key in self.trusted_keys],
            "devices": [
                {
                    "device": d.device,
                    "state": d.state,
                    "version": d.version,
                    "manifest_digest": d.manifest_digest,
                    "downloaded_bytes": d.downloaded_bytes,
                }
                for d in self.devices
            ],
        }


def manifest_digest(manifest: ModelManifest) -> str:
    """One manifest's identity: sha256 of its canonical signed form."""
    return digest(canonical_json(manifest.to_dict()))


def deliver_edge_model(
    float_model: Path,
    splits: DigitSplits,
    *,
    devices: Sequence[str],
    workdir: Path,
    broker: MqttSettings,
    topics: Topics,
    cloud_model: str,
    progress: Progress | None = None,
) -> EdgeDelivery:
    """Publish ``float_model`` to a CDN of its own and install it on every device in ``devices``.

    ``broker``, ``topics`` and ``cloud_model`` configure each device's agent as
    it waits for its first model (it does not connect during the install).
    """
    if not devices:
        raise ValueError("deliver to at least one device")
    step: Progress = progress or (lambda stage, fraction: None)
    key = SigningKey.generate()
    trusted = (key.public_key,)
    try:
        registry = open_registry(f"sqlite:///{workdir / 'cdn-registry.db'}")
        store = LocalBlobStore(workdir / "cdn-blobs")
    except CdnError as e:
        raise DeliveryError(f"cannot set up the CDN's registry and store: {e}") from e
    try:
        step("publish edge model to CDN", 0.0)
        published = _publish(float_model, splits, registry, store, key)
        _assign(registry, key, devices, published.manifest.version)
        step("publish edge model to CDN", 1.0)
        step("install from the CDN", 0.0)
        # A fresh device: no local model yet, so cloud-only until its first install.
        waiting = functools.partial(
            EdgeAgent, None, broker=broker, topics=topics, cloud_model=cloud_model
        )
        installs: list[DeviceInstall] = []
        with _serve_cdn(registry, store) as url:
            for device in devices:
                store_dir = workdir / "devices" / device
                installs.append(
                    _install(waiting(device_id=device), url, trusted, store_dir, published)
                )
                step("install from the CDN", len(installs) / len(devices))
    finally:
        registry.close()
    manifest = published.manifest
    return EdgeDelivery(
        model=manifest.name,
        version=manifest.version,
        manifest_digest=manifest_digest(manifest),
        blob_digest=manifest.blob.digest,
        blob_bytes=manifest.blob.size,
        model_bytes=manifest.blob.raw_size,
        model_digest=manifest.blob.raw_digest,
        agreement=float(published.report["agreement"]),
        cdn_url=url,
        trusted_keys=trusted,
        devices=tuple(installs),
    )


def _publish(
    float_model: Path,
    splits: DigitSplits,
    registry: Registry,
    store: LocalBlobStore,
    key: SigningKey,
) -> PublishResult:
    """The publish pipeline, exactly as ``tandem models publish`` runs it on the demo's inputs."""
    from model_cdn import publish_model

    try:
        return publish_model(
            float_model,
            name=EDGE_MODEL,
            registry=registry,
            store=store,
            signing_key=key,
            quantize=QUANTIZATION,
            calibration=splits.calibration_images,
            validation=(splits.test_images, splits.test_labels),
        )
    except (CdnError, StoreError) as e:  # ValidationError, QuantizationError, PublishError, ...
        raise DeliveryError(f"publishing {EDGE_MODEL} failed: {e}") from e


def _assign(registry: Registry, key: SigningKey, devices: Sequence[str], version: int) -> None:
    """A signed assignment per device, where the CDN serves it (``GET …/assignments/…``)."""
    try:
        for device in devices:
            document = make_assignment(
                key, device=device, model=EDGE_MODEL, version=version, ttl_days=_ASSIGNMENT_TTL_DAYS
            )
            registry.put_assignment(device, EDGE_MODEL, document)
    except CdnError as e:
        raise DeliveryError(f"assigning {EDGE_MODEL}@{version} failed: {e}") from e


@contextlib.contextmanager
def _serve_cdn(registry: Registry, store: LocalBlobStore) -> Iterator[str]:
    """The CDN's HTTP API on a free loopback port, read-only (no admin token); yields its URL.

    uvicorn runs in a thread by the hub's ``HttpServer``: one home for serving
    an ASGI app beside other threads, whichever app it is.
    """
    from cloud_hub import HubError
    from cloud_hub.http import HttpServer
    from model_cdn import create_app

    server = HttpServer(create_app(registry=registry, store=store, admin_token=None), port=0)
    try:
        server.start()
    except HubError as e:
        raise DeliveryError(f"the CDN did not start: {e}") from e
    try:
        yield server.url
    finally:
        server.stop()


def _install(
    agent: EdgeAgent,
    cdn_url: str,
    trusted: Sequence[PublicKey],
    store_dir: Path,
    published: PublishResult,
) -> DeviceInstall:
    """``agent``'s first model, by its updater from the CDN; raises unless it was installed.

    The agent is closed here: the demo's agents start later on what the store holds.
    """
    device, name = agent.device_id, published.manifest.name
    try:
        updater = ModelUpdater(
            agent,
            model=name,
            device_id=device,
            cdn_url=cdn_url,
            trusted_keys=trusted,
            store_dir=store_dir,
        )
        status = updater.check_now()
        if status is None or status.state is not UpdateState.INSTALLED:
            reason = "no assignment found" if status is None else status.reason
            raise DeliveryError(f"{device} did not install {name}: {reason}")
        installed = DeviceModelStore(store_dir).installed(name, status.version, trusted)
    except EdgeError as e:  # DownloadError (no assignment to fetch), StoreError, ...
        raise DeliveryError(f"{device} could not install {name}: {e}") from e
    finally:
        agent.close()
    return DeviceInstall(
        device=device,
        state=status.state.value,
        version=status.version,
        manifest_digest=manifest_digest(installed.manifest),
        downloaded_bytes=updater.stats.blob_bytes_read,
        store_dir=store_dir,
    )
