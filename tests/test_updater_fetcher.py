"""``ModelUpdater(fetcher=...)``: the CDN seam, with a second real implementation.

``HttpxFetcher`` is a ``CdnFetcher`` on httpx instead of urllib: another
HTTP client, a real socket to the loopback CDN. The rules (limits, resume,
what an error becomes) are the base's, so they hold for it unchanged.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from edge_agent import DownloadError, ModelUpdater
from edge_agent.updater import CdnFetcher, DownloadSettings, FetchResponse
from shared import MAX_DOCUMENT_BYTES, UpdateState

from ._brokers import free_port
from ._test_cdn import BlobFault, LoopbackCdn
from ._update_kit import MODEL, Rig


class _HttpxResponse:
    """An httpx streaming response as ``FetchResponse``: ``read(n)`` over its raw chunks."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._chunks = response.iter_raw()
        self._buffer = b""

    @property
    def status(self) -> int:
        return self._response.status_code

    @property
    def reason(self) -> str:
        return self._response.reason_phrase

    @property
    def headers(self) -> httpx.Headers:
        return self._response.headers

    def read(self, amount: int, /) -> bytes:
        if not self._buffer:  # like a socket: what one chunk brings, so nothing read is lost
            self._buffer = next(self._chunks, b"")
        data, self._buffer = self._buffer[:amount], self._buffer[amount:]
        return data


class HttpxFetcher(CdnFetcher):
    """A second ``CdnFetcher``: httpx's client, counting the GETs it opens."""

    def __init__(self, base_url: str, *, settings: DownloadSettings | None = None) -> None:
        super().__init__(base_url, settings=settings)
        self.client = httpx.Client(timeout=self.settings.timeout_s)
        self.opened: list[str] = []

    @contextlib.contextmanager
    def _open(self, url: str, headers: dict[str, str]) -> Iterator[FetchResponse]:
        self.opened.append(url)
        with self.client.stream("GET", url, headers=headers) as response:
            yield _HttpxResponse(response)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    cdn = LoopbackCdn()
    try:
        yield Rig.create(cdn, tmp_path, device="dev-fetcher")
    finally:
        cdn.close()


def _updater(rig: Rig, fetcher: CdnFetcher) -> ModelUpdater:
    return ModelUpdater(
        rig.agent(),
        model=MODEL,
        device_id=rig.device,
        fetcher=fetcher,
        trusted_keys=[rig.key.public_key],
        store_dir=rig.store_dir,
    )


def test_an_update_through_another_fetcher_resumes_and_installs(rig: Rig) -> None:
    """Kills: the updater building its own client and ignoring ``fetcher``."""
    v2 = rig.publisher.publish(2)
    rig.cdn.put_assignment(rig.device, MODEL, rig.publisher.assignment(rig.device, 2))
    rig.cdn.fault(v2.blob_digest, BlobFault(drop_after=100))
    fetcher = HttpxFetcher(rig.cdn.url)
    updater = _updater(rig, fetcher)

    status = updater.check_now()

    assert status is not None and status.state is UpdateState.INSTALLED, status
    first, second = rig.cdn.blob_requests(v2.blob_digest)
    assert (first.status, first.sent, second.status, second.range) == (200, 100, 206, "bytes=100-")
    assert updater.stats.resumed == 1 and updater.stats.blob_bytes_read == len(v2.blob)
    assert fetcher.opened.count(fetcher.blob_url(v2.blob_digest)) == 2
    assert fetcher.assignment_url(rig.device, MODEL) in fetcher.opened


def test_the_rules_hold_for_any_fetcher(rig: Rig, tmp_path: Path) -> None:
    """Kills: the one-byte-past-the-end read, or the document limit, left to implementations."""
    v2 = rig.publisher.publish(2)
    rig.cdn.fault(v2.blob_digest, BlobFault(endless=True))
    fetcher = HttpxFetcher(rig.cdn.url)
    with pytest.raises(DownloadError, match=r"more than the .* bytes the manifest declares"):
        fetcher.download_blob(v2.blob_digest, len(v2.blob), tmp_path / "blob.part")
    assert not (tmp_path / "blob.part").exists()
    rig.cdn.put_assignment(rig.device, MODEL, b"x" * (MAX_DOCUMENT_BYTES + 1))
    with pytest.raises(DownloadError, match=r"larger than|announces"):
        fetcher.fetch_document(fetcher.assignment_url(rig.device, MODEL))
    assert fetcher.fetch_document(fetcher.manifest_url("absent", 3)) is None  # a 404


def test_the_clients_own_errors_become_download_errors(tmp_path: Path) -> None:
    """Kills: a foreign exception (httpx.ConnectError) escaping the public methods."""
    settings = DownloadSettings(max_attempts=2, retry_delay_s=0.0)
    fetcher = HttpxFetcher(f"http://127.0.0.1:{free_port()}", settings=settings)
    with pytest.raises(DownloadError, match="ConnectError") as caught:
        fetcher.fetch_document(fetcher.root_url(2))
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    digest = "sha256:" + "ab" * 32
    cancel = threading.Event()
    with pytest.raises(DownloadError, match=r"incomplete after 2 requests.*ConnectError"):
        fetcher.download_blob(digest, 10, tmp_path / "b.part", cancel=cancel)


def test_the_updater_takes_a_url_or_a_fetcher(rig: Rig) -> None:
    fetcher = HttpxFetcher(rig.cdn.url)
    common = {"model": MODEL, "device_id": rig.device, "trusted_keys": [rig.key.public_key]}
    with pytest.raises(ValueError, match=r"cdn_url .* or fetcher"):
        ModelUpdater(rig.agent(), store_dir=rig.store_dir, **common)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"cdn_url .* or fetcher"):
        ModelUpdater(
            rig.agent(),
            store_dir=rig.store_dir,
            cdn_url=rig.cdn.url,
            fetcher=fetcher,
            **common,  # type: ignore[arg-type]
        )
    with pytest.raises(ValueError, match="configure the default fetcher"):
        ModelUpdater(
            rig.agent(),
            store_dir=rig.store_dir,
            fetcher=fetcher,
            read_token="t",
            **common,  # type: ignore[arg-type]
        )
