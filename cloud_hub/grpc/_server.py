"""``GrpcServer``: a ``grpc.aio`` server of one ``InferenceServicer``.

Two ways to run it. On an event loop the caller owns (``await start()`` /
``await stop(grace_s)``): a hub's HTTP ingress process serves gRPC so, on the
same loop (uvloop's; grpc.aio runs on it) that reads its executors' replies,
with no thread hand-off per request. Or in a thread of its own with a standard
asyncio loop (``with GrpcServer(...)``, ``start_in_thread`` / ``close``): for
an in-process ``Hub``, whose answers come from its batchers' threads.

Options: ``grpc.max_receive_message_length`` is the HTTP API's body limit
(a larger message is refused by gRPC itself, RESOURCE_EXHAUSTED, before it is
parsed); ``grpc.so_reuseport`` lets several ingress processes share the port
(the kernel spreads connections), as their HTTP servers do. With ``tls``
(``certfile``/``keyfile``, and ``ca_certs`` to require client certificates) it
serves over TLS. ``stop`` is graceful: no new RPCs, those in flight get
``grace_s`` to finish, then are cancelled.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc
from grpc import aio

from shared import TlsSettings
from shared.server import ApiKeyGuard

from .._errors import HubError
from .._hub import Hub
from ..http import DEFAULT_MAX_BODY_BYTES, ServedHub
from ..http._bodies import ByteBudget
from . import inference_pb2_grpc as pb_grpc
from ._servicer import InferenceServicer

__all__ = ["DEFAULT_GRPC_PORT", "GrpcServer"]

DEFAULT_GRPC_PORT = 8001  # Triton's
_START_S = 30.0


class GrpcServer:
    """The KServe v2 gRPC API of ``hub`` on ``host:port`` (0: a free port, see ``port``).

    ``hub``: an in-process ``Hub`` (served as ``create_app`` serves it) or a ``ServedHub``.
    ``budget``: an HTTP app's ``ByteBudget`` (``app.state.byte_budget``) when both run
    on one event loop: requests of both protocols then share its limit.
    """

    def __init__(
        self,
        hub: Hub | ServedHub,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_GRPC_PORT,
        api_keys: ApiKeyGuard | None = None,
        tls: TlsSettings | None = None,
        max_message_bytes: int = DEFAULT_MAX_BODY_BYTES,
        reuse_port: bool = True,
        budget: ByteBudget | None = None,
    ) -> None:
        if tls is not None and (tls.certfile is None or tls.keyfile is None):
            raise HubError("gRPC over TLS needs the server's certificate and key")
        if max_message_bytes <= 0:
            raise ValueError("max_message_bytes must be positive")
        self.servicer = InferenceServicer(ServedHub.of(hub), api_keys=api_keys, budget=budget)
        self.host, self.port = host, port
        self.tls = tls
        self.options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ]
        self._server: aio.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def target(self) -> str:
        """``host:port`` for a client (tritonclient.grpc's ``url``)."""
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve on the running loop; ``port`` is then the bound one."""
        server = aio.server(options=self.options)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, server)
        address = f"{self.host}:{self.port}"
        try:
            if self.tls is None:
                bound = server.add_insecure_port(address)
            else:
                bound = server.add_secure_port(address, _credentials(self.tls))
        except RuntimeError as e:  # grpc raises it when the port cannot be bound
            raise HubError(f"gRPC cannot listen on {address}: {e}") from e
        self.port = bound
        await server.start()
        self._server = server

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop taking RPCs; those in flight have ``grace_s`` to finish."""
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None

    # -- in a thread of its own ----------------------------------------------------------

    def start_in_thread(self) -> GrpcServer:
        """Serve from a thread with its own event loop; returns once it listens."""
        started = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as e:
                failure.append(e)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="grpc-server", daemon=True)
        self._thread.start()
        if not started.wait(_START_S):
            raise HubError(f"the gRPC server did not start within {_START_S} s")
        if failure:
            self._thread.join()
            raise failure[0]
        return self

    def close(self) -> None:
        """Stop the thread's server (gracefully) and its loop."""
        if self._thread is None or self._loop is None:
            return
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._thread = None

    def __enter__(self) -> GrpcServer:
        return self.start_in_thread()

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _credentials(tls: TlsSettings) -> grpc.ServerCredentials:
    assert tls.certfile is not None and tls.keyfile is not None
    key, chain = Path(tls.keyfile).read_bytes(), Path(tls.certfile).read_bytes()
    roots = Path(tls.ca_certs).read_bytes() if tls.ca_certs else None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=roots, require_client_auth=roots is not None
    )
