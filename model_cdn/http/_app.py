"""The app factory: one FastAPI app over a registry, a blob store and the optional parts.

``create_app`` checks its tokens, picks the one ``AssignmentSender``
(given; else the rollout controller's; else, with ``mqtt``, a link of the
app's own that connects at the first assignment and closes with the app's
lifespan; else none: assignments are stored only), installs the JSON error
answers (``_errors``) and adds the routes of each group: health and metrics, models,
blobs, assignments, rollouts and devices, and the root metadata devices walk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI

from shared import MAX_BLOB_BYTES, MqttSettings, PublicKey, Topics
from shared.server import ApiKeyGuard
from shared.server.store import BlobStore

from .._assignment_sender import AssignmentSender
from .._errors import CdnError
from .._upload_trust import UploadTrust
from ..registry import Registry
from ._assignments import add_assignment_routes
from ._auth import CdnAuth, Guards
from ._blobs import add_blob_routes
from ._console import add_console_routes
from ._errors import install_error_handlers
from ._health import add_health_routes, new_metrics
from ._models import add_model_routes
from ._rollouts import add_rollout_routes
from ._roots import add_root_routes

if TYPE_CHECKING:
    from ..rollout._controller import RolloutController

__all__ = ["create_app"]


def create_app(
    *,
    registry: Registry,
    store: BlobStore,
    admin_token: str | None,
    read_token: str | None = None,
    trusted_keys: list[PublicKey] | None = None,
    mqtt: MqttSettings | None = None,
    topics: Topics = Topics(),  # noqa: B008 - frozen dataclass, safe as a default
    max_blob_bytes: int = MAX_BLOB_BYTES,
    api_keys: ApiKeyGuard | None = None,
    controller: RolloutController | None = None,
    sender: AssignmentSender | None = None,
    trust_dir: Path | None = None,
) -> FastAPI:
    """The CDN app over ``registry`` and ``store``.

    ``admin_token`` None turns the admin routes off (403) unless ``api_keys``
    is set. ``read_token`` set makes reads need it (or the admin token).
    ``api_keys`` set lets keys with scopes in, and makes reads need one
    (or a token). ``trusted_keys`` set makes uploads of manifests and
    assignments need a signature by one of them; a root in ``trust_dir``
    makes them need its publisher and assigner roles instead
    (``_upload_trust``; devices check again). ``controller`` set turns on the rollout API;
    the caller starts and stops it. An assignment PUT is published, retained,
    through ``sender``, else the controller's sender, else (``mqtt``
    set) a sender of the app's own on the broker at ``mqtt``. ``trust_dir``
    (what ``tandem keys root`` writes) is served at ``/v1/roots/…`` for devices
    to rotate their root of trust.
    """
    for what, token in (("admin", admin_token), ("read", read_token)):
        if token is not None and (not token or not token.isprintable() or " " in token):
            raise CdnError(f"the {what} token must be non-empty printable text without spaces")
    own: AssignmentSender | None = None
    if sender is None and controller is not None:
        sender = controller.sender
    if sender is None and mqtt is not None:
        sender = own = AssignmentSender.connect(mqtt, topics, lazy=True)
    app = FastAPI(
        title="Tandem model CDN",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=_closing(own),
    )
    metrics = new_metrics(controller)
    app.state.registry, app.state.store = registry, store
    app.state.metrics, app.state.sender = metrics, sender
    install_error_handlers(app)
    auth = CdnAuth(admin_token=admin_token, read_token=read_token, api_keys=api_keys)
    guards = Guards.of(auth)
    trust = UploadTrust(trusted_keys, trust_dir)
    add_health_routes(app, metrics)
    add_model_routes(app, registry, store, metrics, trust, guards)
    add_blob_routes(app, store, metrics, max_blob_bytes, guards)
    add_assignment_routes(app, registry, sender, trust, guards)
    add_rollout_routes(app, controller, registry, guards)
    add_console_routes(app, auth, controller, registry)
    add_root_routes(app, trust_dir, guards)
    return app


def _closing(
    own: AssignmentSender | None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """A lifespan that closes the app's own assignment sender (its MQTT link) on shutdown."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if own is not None:
                own.close()

    return lifespan
