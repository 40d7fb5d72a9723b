"""The simulated devices' HTTP client for the CDN: keep-alive connections, one per thread.

A thousand devices share a few download threads; each thread keeps one
``http.client`` connection open to the CDN and reuses it, so a rollout costs
two requests per device and almost no TCP handshakes.

Invariants: every request has a timeout; a document is read up to
``MAX_DOCUMENT_BYTES``; a blob is read to exactly the size the signed
manifest declares and must hash to its digest; a connection that the server
closed while idle is replaced once, transparently (a keep-alive race, not an
error). Failures are ``SimulatorError`` with one line.
"""

from __future__ import annotations

import http.client
import ssl
import threading
from urllib.parse import urlsplit

from shared import MAX_DOCUMENT_BYTES, CdnPaths, ConfigError, TlsSettings, digest

from ._errors import SimulatorError

__all__ = ["PooledCdnClient"]

_CHUNK = 64 * 1024
# What a server's idle-timeout close looks like to the next request on that connection.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class PooledCdnClient:
    """GETs against one CDN from any number of threads, a keep-alive connection each."""

    def __init__(
        self,
        base_url: str,
        *,
        read_token: str | None = None,
        timeout_s: float = 15.0,
        tls: TlsSettings | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SimulatorError(f"CDN URL must be http:// or https://, got {base_url!r:.100}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._paths = CdnPaths(parts.path)  # URLs under the CDN's own path, if it has one
        self._timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {read_token}"} if read_token else {}
        self._context: ssl.SSLContext | None = None
        if self._https:
            self._context = ssl.create_default_context(
                cafile=tls.ca_certs if tls is not None else None
            )
            if tls is not None and tls.certfile is not None:
                self._context.load_cert_chain(tls.certfile, tls.keyfile)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[http.client.HTTPConnection] = []
        self.requests = 0  # all threads together; for the summary

    # -- the two things a device fetches ---------------------------------------------------

    def manifest(self, model: str, version: int) -> bytes | None:
        """The signed manifest of ``model@version`` (``None``: the CDN has none)."""
        try:
            path = self._paths.manifest(model, version)
        except ConfigError as e:
            raise SimulatorError(f"cannot ask for {model!r:.80}@{version!r:.20}: {e}") from e
        return self._get(path, None)

    def blob(self, blob_digest: str, size: int) -> bytes:
        """Blob ``blob_digest``: exactly ``size`` bytes that hash to it, else raise."""
        if not isinstance(size, int) or size < 1:
            raise SimulatorError(f"blob {blob_digest}: bad declared size {size!r:.20}")
        try:
            path = self._paths.blob(blob_digest)
        except ConfigError as e:
            raise SimulatorError(str(e)) from e
        data = self._get(path, size)
        if data is None:
            raise SimulatorError(f"the CDN has no blob {blob_digest}")
        if digest(data) != blob_digest:
            raise SimulatorError(f"downloaded blob does not match its digest {blob_digest}")
        return data

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()

    # -- inside ----------------------------------------------------------------------------

    def _get(self, path: str, exact_size: int | None) -> bytes | None:
        """The body at ``path``; ``exact_size`` set: a blob of that size, else a document."""
        for attempt in (1, 2):
            connection = self._connection()
            try:
                connection.request("GET", path, headers=self._headers)
                response = connection.getresponse()
                with self._lock:
                    self.requests += 1
                return self._read(response, path, exact_size)
            except _STALE as e:
                self._drop(connection)
                if attempt == 2:
                    raise SimulatorError(f"GET {path}: {type(e).__name__}: {e}") from e
            except (OSError, http.client.HTTPException) as e:
                self._drop(connection)
                raise SimulatorError(f"GET {path}: {type(e).__name__}: {e}") from e
            except SimulatorError:
                self._drop(connection)  # what is left of that response is unreadable
                raise
        raise AssertionError("unreachable")

    def _read(
        self, response: http.client.HTTPResponse, path: str, exact_size: int | None
    ) -> bytes | None:
        limit = MAX_DOCUMENT_BYTES if exact_size is None else exact_size
        if response.status == 404:
            response.read(MAX_DOCUMENT_BYTES)
            return None
        if response.status != 200:
            raise SimulatorError(f"GET {path}: HTTP {response.status} {response.reason}")
        declared = response.getheader("Content-Length")
        if declared is not None and (
            not declared.isdigit()
            or int(declared) > limit
            or (exact_size is not None and int(declared) != exact_size)
        ):
            raise SimulatorError(f"GET {path}: Content-Length {declared:.20} where {limit} is due")
        parts: list[bytes] = []
        have = 0
        while have <= limit:
            chunk = response.read(min(_CHUNK, limit + 1 - have))
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        if have > limit:
            raise SimulatorError(f"GET {path}: more than {limit} bytes")
        if exact_size is not None and have != exact_size:
            raise SimulatorError(f"GET {path}: {have} bytes where {exact_size} are due")
        if response.will_close:
            self._drop(self._local.connection)
        return b"".join(parts)

    def _connection(self) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            if self._https:
                connection = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self._timeout_s, context=self._context
                )
            else:
                connection = http.client.HTTPConnection(
                    self._host, self._port, timeout=self._timeout_s
                )
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def _drop(self, connection: http.client.HTTPConnection) -> None:
        connection.close()
        self._local.connection = None
        with self._lock:
            if connection in self._connections:
                self._connections.remove(connection)
