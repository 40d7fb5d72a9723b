"""A small client for the CDN's admin API: publishing, assignments, rollouts, the fleet.

What ``tandem rollout``, ``tandem fleet list/show`` and, given ``--cdn``,
``tandem models publish/assign`` use; the publish pipeline's
``AdminApiTarget`` sends a release through it. Standard library only
(``http.client``), one connection per request, JSON in and out (blobs as
raw bytes); URLs from ``shared.CdnPaths``. Every failure is an
``AdminApiError`` with a one-line message:

- the server answered with an error: ``status`` is the HTTP status and the
  message is the server's ``{"error": "…"}`` text;
- the server could not be reached, TLS failed or the answer was not JSON:
  ``status`` is None and the message says so (``cannot reach the CDN at URL: …``).

Its one exception, ``AdminApiError``, hangs in the tree drawn in ``_errors``.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from shared import MAX_BLOB_BYTES, MAX_DOCUMENT_BYTES, CdnPaths

from ._errors import AdminApiError

__all__ = ["DEFAULT_CDN_URL", "AdminApiError", "AdminClient"]

DEFAULT_CDN_URL = "http://127.0.0.1:8700"
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # a fleet listing of many thousand devices fits


class AdminClient:
    """The CDN's admin API at ``url`` (``http://`` or ``https://``).

    ``token``: the admin token or an API key with ``rollout:admin`` (sent as
    ``Authorization: Bearer``). ``ca``: a PEM CA file to trust for HTTPS
    instead of the system's. ``timeout_s``: per connect and per read.
    Raises ``ValueError`` for a URL, token or timeout that cannot work.
    """

    def __init__(
        self,
        url: str = DEFAULT_CDN_URL,
        token: str | None = None,
        ca: str | Path | None = None,
        timeout_s: float = 10,
    ) -> None:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the CDN URL must start with http:// or https://, got {url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"the CDN URL takes no query or fragment, got {url!r}")
        try:
            port = parts.port
        except ValueError as e:
            raise ValueError(f"the CDN URL has a bad port: {url!r}") from e
        if token is not None and (not token or not token.isprintable() or " " in token):
            raise ValueError("the admin token must be non-empty printable text without spaces")
        if isinstance(timeout_s, bool) or not math.isfinite(timeout_s) or timeout_s <= 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if ca is not None and parts.scheme != "https":
            raise ValueError("a CA file is for https:// URLs only")
        self.url = url.strip().rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port
        self._paths = CdnPaths(parts.path)
        self._token = token
        self._timeout_s = float(timeout_s)
        self._ssl: ssl.SSLContext | None = None
        if self._https:
            try:
                self._ssl = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
            except (OSError, ssl.SSLError) as e:
                raise ValueError(f"cannot use {ca} as a CA file: {e}") from e

    # -- rollouts ------------------------------------------------------------

    def start_rollout(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Start a rollout (``body`` as the rollout API takes it); its status object."""
        return self._object("POST", self._paths.rollouts(), body=dict(body))

    def list_rollouts(self) -> list[dict[str, Any]]:
        """Every rollout's status object, newest first."""
        return self._list("GET", self._paths.rollouts(), "rollouts")

    def get_rollout(self, rollout_id: str) -> dict[str, Any]:
        return self._object("GET", self._paths.rollout(_text(rollout_id)))

    def pause(self, rollout_id: str) -> dict[str, Any]:
        return self._command(rollout_id, "pause")

    def resume(self, rollout_id: str) -> dict[str, Any]:
        return self._command(rollout_id, "resume")

    def abort(self, rollout_id: str) -> dict[str, Any]:
        return self._command(rollout_id, "abort")

    def rollback(self, rollout_id: str) -> dict[str, Any]:
        return self._command(rollout_id, "rollback")

    def skip_gate(self, rollout_id: str, reason: str) -> dict[str, Any]:
        """Let the current wave go on without its health judgement (recorded, with ``reason``)."""
        path = self._paths.rollout_command(_text(rollout_id), "skip-gate")
        return self._object("POST", path, body={"confirm": True, "reason": reason})

    # -- fleet ---------------------------------------------------------------

    def list_devices(
        self,
        labels: Mapping[str, str] | None = None,
        model: str | None = None,
        version: int | None = None,
    ) -> list[dict[str, Any]]:
        """Devices with every label in ``labels`` (and running ``model``/``version``)."""
        query: list[tuple[str, str]] = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        if model is not None:
            query.append(("model", model))
        if version is not None:
            query.append(("version", str(version)))
        path = self._paths.devices() + (f"?{urlencode(query)}" if query else "")
        return self._list("GET", path, "devices")

    def get_device(self, device: str) -> dict[str, Any]:
        return self._object("GET", self._paths.device(device))

    def set_labels(self, labels: Mapping[str, Mapping[str, str]]) -> list[dict[str, Any]]:
        """The operator's labels for each device named (replacing theirs); the devices."""
        body = {"devices": {d: dict(v) for d, v in labels.items()}}
        return self._list("POST", self._paths.fleet_labels(), "devices", body=body)

    # -- publishing and assignments --------------------------------------------

    def latest_manifest(self, name: str) -> dict[str, Any] | None:
        """The latest signed manifest of ``name`` as the CDN serves it; None: no such model."""
        return self.manifest(name)

    def manifest(self, name: str, version: int | None = None) -> dict[str, Any] | None:
        """The signed manifest of ``name@version`` (the latest when None), unverified;
        None: no such model or version."""
        try:
            return self._object("GET", self._paths.manifest(name, version))
        except AdminApiError as e:
            if e.status == 404:
                return None
            raise

    def list_versions(self, name: str) -> list[dict[str, Any]]:
        """``{version, blob_digest, published_at}`` of each version of ``name``; [] if none."""
        try:
            return self._list("GET", self._paths.versions(name), "versions")
        except AdminApiError as e:
            if e.status == 404:
                return []
            raise

    def get_blob(self, digest: str, size: int) -> bytes:
        """Blob ``digest``: exactly ``size`` bytes that hash to it, else ``AdminApiError``."""
        path = self._paths.blob(digest)
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_BLOB_BYTES:
            raise ValueError(f"a blob size is 1 to {MAX_BLOB_BYTES} bytes, got {size!r:.20}")
        status, reason, raw = self._exchange("GET", path, None, "application/octet-stream", size)
        if not 200 <= status < 300:
            raise AdminApiError(_refusal(raw, status, reason, path), status=status)
        if len(raw) != size or "sha256:" + hashlib.sha256(raw).hexdigest() != digest:
            raise AdminApiError(f"the CDN at {self.url} sent blob {digest} damaged or cut short")
        return raw

    def put_blob(self, digest: str, data: bytes) -> dict[str, Any]:
        """Upload a blob under its digest (needs ``models:publish``); the server checks it."""
        return self._object("PUT", self._paths.blob(digest), body=bytes(data))

    def add_version(self, name: str, signed_manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Register a signed manifest whose blobs are uploaded (needs ``models:publish``)."""
        return self._object("POST", self._paths.versions(name), body=dict(signed_manifest))

    def put_assignment(
        self, device: str, model: str, signed_assignment: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Assign (needs ``rollout:admin``): the CDN checks and stores the signed
        assignment and, with a broker, publishes it retained; ``published`` says which."""
        path = self._paths.assignment(device, model)
        return self._object("PUT", path, body=dict(signed_assignment))

    # -- transport -----------------------------------------------------------

    def _command(self, rollout_id: str, action: str) -> dict[str, Any]:
        return self._object("POST", self._paths.rollout_command(_text(rollout_id), action))

    def _object(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        answer = self._request(method, path, body)
        if not isinstance(answer, dict):
            raise AdminApiError(f"the CDN at {self.url} answered {path} with no JSON object")
        return answer

    def _list(self, method: str, path: str, key: str, body: Any = None) -> list[dict[str, Any]]:
        items = self._object(method, path, body=body).get(key)
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise AdminApiError(f"the CDN at {self.url} answered {path} without a {key!r} list")
        return items

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        """JSON in (bytes: sent as they are), JSON out; a refusal raises ``AdminApiError``."""
        data: bytes | None = None
        content_type = "application/json"
        if isinstance(body, bytes):
            data, content_type = body, "application/octet-stream"
        elif body is not None:
            data = json.dumps(body, allow_nan=False).encode()
        status, reason, raw = self._exchange(method, path, data, content_type, MAX_RESPONSE_BYTES)
        try:
            answer = json.loads(raw) if raw else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            answer = None
            if 200 <= status < 300:
                raise AdminApiError(
                    f"the CDN at {self.url} answered {method} {path} with no JSON "
                    f"(is it a Tandem CDN?)",
                    status=status,
                ) from None
        if 200 <= status < 300:
            return answer
        raise AdminApiError(_refusal(raw, status, reason, path), status=status)

    def _exchange(
        self, method: str, path: str, data: bytes | None, content_type: str, limit: int
    ) -> tuple[int, str, bytes]:
        """One request: (status, reason, body of at most ``limit`` bytes)."""
        headers = {"Accept": "application/json", "User-Agent": "tandem-admin"}
        if data is not None:
            headers["Content-Type"] = content_type
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        connection: http.client.HTTPConnection
        if self._https:
            connection = http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout_s, context=self._ssl
            )
        else:
            connection = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read(limit + 1)
            status, reason = response.status, response.reason
        except ssl.SSLError as e:  # before OSError: it is one
            raise AdminApiError(f"TLS with the CDN at {self.url} failed: {_why(e)}") from e
        except (OSError, http.client.HTTPException) as e:
            raise AdminApiError(f"cannot reach the CDN at {self.url}: {_why(e)}") from e
        finally:
            connection.close()
        if len(raw) > limit:
            raise AdminApiError(f"the CDN at {self.url} answered with more than {_size(limit)}")
        return status, reason, raw


def _refusal(raw: bytes, status: int, reason: str, path: str) -> str:
    """The server's ``{"error": "…"}`` line, or the status when it sent none."""
    try:
        answer = json.loads(raw[:MAX_DOCUMENT_BYTES]) if raw else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        answer = None
    message = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(message, str) and message.strip():
        return message
    message = f"HTTP {status} {reason}".strip()
    if status == 404 and CdnPaths().rollouts() in path:
        message += " (does this CDN run the rollout controller?)"
    return message


def _size(limit: int) -> str:
    return f"{limit // (1024 * 1024)} MiB" if limit >= 1024 * 1024 else f"{limit} bytes"


def _text(value: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("an id must be non-empty text")
    return value


def _why(error: BaseException) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__
