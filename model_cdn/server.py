"""Running the CDN server: registry, store, rollout service and HTTP app, started and stopped.

What ``tandem cdn serve`` does once its options are checked::

    with CdnServer(CdnServeSettings(registry=..., store=..., ...)) as server:
        server.run()        # uvicorn, until SIGINT / SIGTERM

``__enter__`` opens the registry (creating a SQLite file when absent) and
the blob store, starts the rollout service (fleet link and controller)
when a signing key and a broker are given, and builds the app
(``create_app``); ``__exit__`` stops the service and closes the registry,
however ``run`` ended. FastAPI and uvicorn load on ``__enter__``: without
them it raises ``CdnError`` naming the missing package.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared import MqttSettings, PublicKey, SigningKey, TlsSettings, Topics
from shared.server import ApiKeyGuard, HttpTimeouts, rate_limiter, uvicorn_options
from shared.server.store import open_store

from ._errors import CdnError
from .registry import Registry, open_registry
from .rollout._leader import DEFAULT_LEASE_TTL_S

if TYPE_CHECKING:
    from fastapi import FastAPI

    from .rollout._service import FleetService

__all__ = ["CdnServeSettings", "CdnServer"]

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True, kw_only=True)
class CdnServeSettings:
    """Where the CDN keeps its state, who may do what, and where it listens.

    ``registry``/``store``: URLs as ``open_registry``/``open_store`` take
    them. ``admin_token``/``read_token``/``api_keys`` (an API key file) and
    ``trusted_keys``: as ``create_app`` takes them. ``mqtt``: assignments
    are also published there, retained. ``signer`` (needs ``mqtt``): the
    key that signs rollout assignments; it turns on the rollout controller.
    ``tls``: serve HTTPS (``ca_certs`` set: clients need a certificate).
    ``http_timeouts``: how long a client may take over a request's headers
    and body before it is answered 408 and dropped.
    ``redis_url``: API keys' rate limits shared with every replica through
    that Redis (None: per process). ``leader_lease_s``: the rollout leader's
    lease among replicas on one registry (None: no election, this server
    always leads; only for a single server).
    """

    registry: str
    store: str
    host: str = "127.0.0.1"
    port: int = 8700  # TCP
    admin_token: str | None = None
    read_token: str | None = None
    api_keys: Path | None = None
    trusted_keys: tuple[PublicKey, ...] = ()
    mqtt: MqttSettings | None = None
    topics: Topics = field(default_factory=Topics)
    signer: SigningKey | None = None
    log_level: str = "info"
    tls: TlsSettings | None = None
    http_timeouts: HttpTimeouts = field(default_factory=HttpTimeouts)
    trust_dir: Path | None = None  # the roots 'tandem keys root' writes, served to devices
    redis_url: str | None = None
    leader_lease_s: float | None = DEFAULT_LEASE_TTL_S

    def __post_init__(self) -> None:
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}")
        if self.signer is not None and self.mqtt is None:
            raise ValueError("a rollout signer needs a broker")
        object.__setattr__(self, "trusted_keys", tuple(self.trusted_keys))


class CdnServer:
    """The CDN's parts for one run of the server; a context manager (see the module doc)."""

    def __init__(self, settings: CdnServeSettings) -> None:
        self.settings = settings
        self.registry: Registry | None = None
        self.service: FleetService | None = None
        self.app: FastAPI | None = None

    def __enter__(self) -> CdnServer:
        s = self.settings
        try:
            import uvicorn  # noqa: F401  # here, so a missing package fails before anything opens

            from .http import create_app
        except ImportError as e:
            raise CdnError(f"serving needs {e.name!r}: install tandem[cdn]") from e
        guard = None
        if s.api_keys is not None:
            guard = ApiKeyGuard.from_file(s.api_keys, limiter=rate_limiter(s.redis_url))
        self.registry = open_registry(s.registry, create=True)
        try:
            if s.signer is not None and s.mqtt is not None:
                from .rollout._service import FleetService

                self.service = FleetService(
                    self.registry, s.signer, s.mqtt, s.topics, leader_lease_s=s.leader_lease_s
                ).start()
            self.app = create_app(
                registry=self.registry,
                store=open_store(s.store),
                admin_token=s.admin_token or None,
                read_token=s.read_token or None,
                trusted_keys=list(s.trusted_keys) or None,
                mqtt=s.mqtt,
                topics=s.topics,
                api_keys=guard,
                controller=None if self.service is None else self.service.controller,
                trust_dir=s.trust_dir,
            )
        except BaseException:
            self.__exit__()
            raise
        return self

    def run(self) -> None:
        """Serve HTTP(S) until SIGINT or SIGTERM."""
        import uvicorn

        uvicorn.Server(self.uvicorn_config()).run()

    def uvicorn_config(self) -> Any:
        """The ``uvicorn.Config`` that ``run`` serves: address, TLS, log level, deadlines."""
        import uvicorn
        from uvicorn.protocols.http.h11_impl import H11Protocol

        if self.app is None:
            raise CdnError("enter the CdnServer (with ...) before running it")
        s = self.settings
        return uvicorn.Config(
            self.app,
            host=s.host,
            port=s.port,
            log_level=s.log_level,
            **_ssl(s.tls),
            **uvicorn_options(H11Protocol, s.http_timeouts),
        )

    def __exit__(self, *exc: object) -> None:
        service, self.service = self.service, None
        registry, self.registry = self.registry, None
        try:
            if service is not None:
                service.stop()
        finally:
            if registry is not None:
                registry.close()


def _ssl(tls: TlsSettings | None) -> dict[str, Any]:
    """uvicorn's arguments for ``tls`` (None: plain HTTP)."""
    if tls is None:
        return {}
    return {
        "ssl_certfile": tls.certfile,
        "ssl_keyfile": tls.keyfile,
        "ssl_ca_certs": tls.ca_certs,
        "ssl_cert_reqs": ssl.CERT_REQUIRED if tls.ca_certs else ssl.CERT_NONE,
    }
