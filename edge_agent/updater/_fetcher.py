"""What the updater asks of a CDN, as one small interface: ``CdnFetcher``.

As python-tuf's ``FetcherInterface``: the public methods hold every rule, and
an implementation only opens one GET (``_open``). ``CdnClient``
(``_download``, the standard library's urllib) is the default; another
HTTP client, a proxy or a local mirror is a subclass given to
``ModelUpdater(fetcher=...)``. URLs come from ``shared.CdnPaths``, the
CDN's one layout, and the size and digest rules from ``shared``
(``MAX_DOCUMENT_BYTES``, ``MAX_BLOB_BYTES``, ``DIGEST_PATTERN``), as the CDN
itself uses them.

Invariants, whatever the implementation:

- Errors are the updater's own: an HTTP status the rules do not take is a
  ``DownloadError`` naming it; anything else ``_open`` or a read raises
  (the client's own errors, ``OSError``...) is wrapped in a
  ``DownloadError`` for a document, and resumed for a blob (see below),
  except a certificate the device does not trust, which fails at once.
- A document (manifest, assignment, root) is read up to
  ``MAX_DOCUMENT_BYTES``; one byte more is an error; a 404 is ``None``.
- A blob is read to exactly the size the signed manifest declares, never
  further: at most one byte past it is read, to tell a server that sends
  more (the endless-data attack) from one that stopped. More or fewer bytes
  than declared, a ``Content-Length`` or ``Content-Range`` that disagrees
  with the manifest, or more than ``budget_factor`` x size read over all
  attempts is a ``DownloadError``.
- Resume: a partial file and the ETag its bytes came with are kept on disk;
  the next request asks ``Range: bytes=N-`` with ``If-Range: <etag>``. A 206
  continues the file only when its ETag and ``Content-Range`` match; a 200,
  or a 206 with another ETag, means the blob changed, and the download
  restarts from byte 0. Bytes of two different bodies are never spliced.
- The digest is not checked here (the caller does, under its own step):
  a complete file is exactly ``size`` bytes, nothing more is promised.
"""

from __future__ import annotations

import re
import ssl
import threading
import time
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from shared import MAX_BLOB_BYTES, MAX_DOCUMENT_BYTES, CdnPaths, ConfigError, TlsSettings

from .._errors import DownloadError, EdgeError, StoreError

__all__ = [
    "CdnFetcher",
    "DownloadResult",
    "DownloadSettings",
    "FetchResponse",
    "discard_partial",
    "partial_etag_path",
]

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


@dataclass(frozen=True, kw_only=True)
class DownloadSettings:
    timeout_s: float = 15.0  # per request: the connect, and each read from the socket
    chunk_bytes: int = 64 * 1024  # one read from the response
    max_attempts: int = 5  # requests per blob, resumes and restarts included
    retry_delay_s: float = 0.2  # before a resume; grows linearly with the attempt
    budget_factor: float = 3.0  # bytes read per blob: at most this x its size, plus a chunk
    max_blob_bytes: int = MAX_BLOB_BYTES  # refuse a manifest that declares a larger blob …
    max_raw_bytes: int = 2 * 1024**3  # … or a model that expands to more
    tls: TlsSettings | None = None  # https://: the CA to pin, a client certificate

    def __post_init__(self) -> None:
        if not self.timeout_s > 0 or not self.retry_delay_s >= 0:
            raise ValueError("timeout_s must be > 0 and retry_delay_s >= 0")
        if self.chunk_bytes < 1 or self.max_attempts < 1 or not self.budget_factor >= 1:
            raise ValueError("chunk_bytes and max_attempts must be >= 1, budget_factor >= 1")


@dataclass
class DownloadResult:
    digest: str
    path: Path  # the complete file: exactly the declared size, digest not yet checked
    bytes_read: int  # body bytes read over all requests
    requests: int
    resumed: int  # requests that continued a partial file
    restarted: int  # partial files dropped because the blob changed under them
    resumed_from_disk: bool  # the first request continued a file left by an earlier run


class FetchResponse(Protocol):
    """One GET's answer, whatever its status: what ``CdnFetcher._open`` returns."""

    @property
    def status(self) -> int: ...

    @property
    def reason(self) -> str: ...

    @property
    def headers(self) -> _Headers: ...

    def read(self, amount: int, /) -> bytes:
        """Up to ``amount`` body bytes; ``b""`` once the body ended."""
        ...


class _Headers(Protocol):
    def get(self, name: str, /) -> str | None: ...


def partial_etag_path(partial: Path) -> Path:
    return partial.with_name(partial.name + ".etag")


def discard_partial(partial: Path) -> None:
    partial.unlink(missing_ok=True)
    partial_etag_path(partial).unlink(missing_ok=True)


class CdnFetcher(ABC):
    """Fetches from one CDN at ``base_url``: manifests, assignments, roots and blobs.

    Subclasses implement ``_open`` alone; the public methods keep the rules
    in the module docstring for every implementation.
    """

    def __init__(self, base_url: str, *, settings: DownloadSettings | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.paths = CdnPaths(self.base_url)
        self.settings = settings or DownloadSettings()

    @abstractmethod
    def _open(self, url: str, headers: dict[str, str]) -> AbstractContextManager[FetchResponse]:
        """One GET of ``url`` with ``headers``: a context manager giving the response.

        Any status comes back as a response (a 404 too); raise only when no
        answer came (the connection, TLS, a timeout). Reads may raise too.
        """

    # -- URLs --------------------------------------------------------------------------------

    def manifest_url(self, model: str, version: int | None = None) -> str:
        """The signed manifest of ``model@version`` (the latest when ``version`` is None)."""
        return self.paths.manifest(model, version)

    def root_url(self, version: int) -> str:
        return self.paths.root(version)

    def assignment_url(self, device: str, model: str) -> str:
        return self.paths.assignment(device, model)

    def blob_url(self, digest: str) -> str:
        """The blob's URL; ``StoreError`` for a digest that is not ``sha256:<64 hex>``."""
        try:
            return self.paths.blob(digest)
        except ConfigError as e:  # from a manifest: refused like any name that would escape
            raise StoreError(f"refusing blob digest {digest!r:.80}: not 'sha256:<64 hex>'") from e

    # -- documents ---------------------------------------------------------------------------

    def fetch_document(self, url: str) -> bytes | None:
        """The body at ``url`` (at most ``MAX_DOCUMENT_BYTES``), or ``None`` on 404."""
        try:
            with self._open(url, {}) as response:
                status = response.status
                if status == 404:
                    return None
                if not 200 <= status < 300:
                    raise DownloadError(f"GET {url}: HTTP {status} {response.reason}")
                _check_length(response, None, MAX_DOCUMENT_BYTES, url)
                body = response.read(MAX_DOCUMENT_BYTES + 1)
        except EdgeError:
            raise
        except Exception as e:  # the client's own: connection, TLS, timeout
            raise DownloadError(f"GET {url}: {type(e).__name__}: {e}") from e
        if len(body) > MAX_DOCUMENT_BYTES:
            raise DownloadError(f"GET {url}: document larger than {MAX_DOCUMENT_BYTES} bytes")
        return bytes(body)

    # -- blobs -------------------------------------------------------------------------------

    def download_blob(
        self,
        digest: str,
        size: int,
        partial: Path,
        *,
        cancel: threading.Event | None = None,
    ) -> DownloadResult:
        """Fetch blob ``digest`` of ``size`` bytes into ``partial``, resuming what is there."""
        url = self.blob_url(digest)
        s = self.settings
        if not 0 < size <= s.max_blob_bytes:
            raise DownloadError(
                f"blob {digest} declares {size} bytes; the limit is {s.max_blob_bytes}"
            )
        budget = int(size * s.budget_factor) + s.chunk_bytes
        etag_file = partial_etag_path(partial)
        have = partial.stat().st_size if partial.is_file() else 0
        etag = etag_file.read_text().strip() if etag_file.is_file() else None
        if have > size or (have and not etag):
            discard_partial(partial)
            have, etag = 0, None
        result = DownloadResult(digest, partial, 0, 0, 0, 0, resumed_from_disk=have > 0)
        last_error = "no request made"
        for attempt in range(s.max_attempts):
            if have == size:
                break
            if attempt and _wait(cancel, s.retry_delay_s * attempt):
                raise DownloadError(f"download of blob {digest} cancelled")
            headers = {"Range": f"bytes={have}-", "If-Range": etag} if have and etag else {}
            result.requests += 1
            try:
                with self._open(url, headers) as response:
                    if not 200 <= response.status < 300:
                        if response.status == 416:  # what we hold is no prefix of what it has
                            discard_partial(partial)
                        raise DownloadError(f"GET {url}: HTTP {response.status} {response.reason}")
                    have, etag = self._continue(response, result, size, have, etag, budget, cancel)
            except EdgeError:
                raise
            except Exception as e:  # resets, timeouts, the disk: resume
                if _untrusted_certificate(e):
                    raise DownloadError(f"GET {url}: {e}") from e  # no retry changes that
                last_error = f"{type(e).__name__}: {e}"
                have = partial.stat().st_size if partial.is_file() else 0
                etag = etag_file.read_text().strip() if etag_file.is_file() else None
                continue
            if have < size:
                last_error = f"the connection ended after {have} of {size} bytes"
        if have != size:
            raise DownloadError(
                f"blob {digest} incomplete after {result.requests} requests, "
                f"{have} of {size} bytes: {last_error}"
            )
        return result

    def _continue(
        self,
        response: FetchResponse,
        result: DownloadResult,
        size: int,
        have: int,
        etag: str | None,
        budget: int,
        cancel: threading.Event | None,
    ) -> tuple[int, str | None]:
        """Write one response's body into the partial file; returns (bytes held, etag)."""
        partial, s, digest = result.path, self.settings, result.digest
        status = response.status
        new_etag = response.headers.get("ETag")
        if status == 206 and have and new_etag == etag:
            try:
                _check_content_range(response.headers.get("Content-Range"), have, size, digest)
            except DownloadError:
                discard_partial(partial)  # next time, start clean rather than fail again
                raise
            result.resumed += 1
            mode = "ab"
        elif status in (200, 206):
            if have:  # the server sent something else than the rest of what we hold
                result.restarted += 1
                discard_partial(partial)
                have = 0
            if status == 206:  # another body's range: ask again for all of it
                return 0, None
            etag = new_etag
            partial.parent.mkdir(parents=True, exist_ok=True)
            if etag:
                partial_etag_path(partial).write_text(etag)
            else:  # without an ETag these bytes can never be resumed
                partial_etag_path(partial).unlink(missing_ok=True)
            mode = "wb"
        else:
            raise DownloadError(f"GET blob {digest}: unexpected HTTP {status}")
        _check_length(response, size - have, None, f"blob {digest}")
        with partial.open(mode) as out:
            while have < size:
                if cancel is not None and cancel.is_set():
                    raise DownloadError(f"download of blob {digest} cancelled")
                data = response.read(min(s.chunk_bytes, size - have))
                if not data:
                    break  # the connection ended early: the caller resumes
                result.bytes_read += len(data)
                if result.bytes_read > budget:
                    raise DownloadError(
                        f"blob {digest}: read {result.bytes_read} bytes for a {size}-byte blob, "
                        "over this download's budget"
                    )
                out.write(data)
                have += len(data)
        if have == size and response.read(1):  # one byte past the end tells "more" from "done"
            result.bytes_read += 1
            discard_partial(partial)
            raise DownloadError(
                f"blob {digest}: the server sent more than the {size} bytes the manifest declares"
            )
        return have, etag


def _untrusted_certificate(error: BaseException) -> bool:
    """True when ``error`` comes from a certificate check, in whatever client's wrapping."""
    seen: set[int] = set()
    todo: list[object] = [error]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        if isinstance(e, ssl.SSLCertVerificationError):
            return True
        seen.add(id(e))
        todo += [getattr(e, "reason", None), e.__cause__, e.__context__]
    return False


def _wait(cancel: threading.Event | None, delay_s: float) -> bool:
    """Sleep ``delay_s``; True when ``cancel`` was set meanwhile."""
    if cancel is None:
        time.sleep(delay_s)
        return False
    return cancel.wait(delay_s)


def _check_length(
    response: FetchResponse, expected: int | None, limit: int | None, what: str
) -> None:
    declared = response.headers.get("Content-Length")
    if declared is None:
        return
    try:
        length = int(declared)
    except ValueError as e:
        raise DownloadError(f"{what}: Content-Length {declared!r:.40} is not a number") from e
    if expected is not None and length != expected:
        raise DownloadError(
            f"{what}: the server announces {length} bytes where the manifest makes {expected}"
        )
    if limit is not None and length > limit:
        raise DownloadError(f"{what}: the server announces {length} bytes; the limit is {limit}")


def _check_content_range(value: str | None, start: int, size: int, digest: str) -> None:
    match = _CONTENT_RANGE.fullmatch((value or "").strip())
    if match is None:
        raise DownloadError(f"blob {digest}: a 206 without a usable Content-Range ({value!r:.60})")
    first, last, total = (int(g) for g in match.groups())
    if total != size:
        raise DownloadError(f"blob {digest}: the server says {total} bytes, the manifest {size}")
    if first != start or last != size - 1:
        raise DownloadError(
            f"blob {digest}: asked for bytes {start}-{size - 1}, got {first}-{last}"
        )
