"""The CDN's blob downloads, served by real uvicorn on loopback and spoken to with httpx.

Whole blobs with their cache headers, byte ranges (satisfiable, unsatisfiable and
ignored), ``If-Range``, ``If-None-Match`` and HEAD, a 5 MB blob sent without ever
being read whole, and our range plan checked against what Starlette's
``FileResponse`` sends. Each test runs on a local store and on a store without
files (see ``_cdn_server``).
"""

from __future__ import annotations

import pytest

from shared import digest

from ._cdn import StreamOnlyStore
from ._cdn_server import BLOB, BLOB_DIGEST, IMMUTABLE, Cdn, publish
from ._cdn_server import cdn_fixture as cdn_fixture
from ._cdn_server import make_cdn_fixture as make_cdn_fixture  # ``cdn`` uses it

# -- blobs ------------------------------------------------------------------


def test_a_blob_is_served_whole_with_cache_headers(cdn: Cdn) -> None:
    publish(cdn, 1)
    response = cdn.client.get(f"/v1/blobs/{BLOB_DIGEST}")
    assert response.status_code == 200
    assert response.content == BLOB
    assert response.headers["etag"] == f'"{BLOB_DIGEST}"'
    assert response.headers["cache-control"] == IMMUTABLE
    assert response.headers["accept-ranges"] == "bytes"
    assert response.headers["content-length"] == str(len(BLOB))
    assert response.headers["content-type"] == "application/octet-stream"


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [
        ("bytes=0-5119", 0, 5120),  # first half
        ("bytes=5120-", 5120, 10240),  # second half
        ("bytes=-100", 10140, 10240),  # suffix
        ("bytes=10000-99999", 10000, 10240),  # last byte past the end: clamped
        ("bytes=-99999", 0, 10240),  # suffix longer than the blob: all of it
        ("bytes=7-7", 7, 8),
        ("bytes=0-" + "9" * 30, 0, 10240),  # a last byte of any length: clamped
        ("bytes=-" + "9" * 30, 0, 10240),  # a suffix of any length: all of it
    ],
)
def test_a_range_gets_206_and_exactly_those_bytes(
    cdn: Cdn, header: str, start: int, end: int
) -> None:
    publish(cdn, 1)
    response = cdn.client.get(f"/v1/blobs/{BLOB_DIGEST}", headers={"Range": header})
    assert response.status_code == 206
    assert response.content == BLOB[start:end]
    assert response.headers["content-range"] == f"bytes {start}-{end - 1}/{len(BLOB)}"
    assert response.headers["content-length"] == str(end - start)
    assert response.headers["etag"] == f'"{BLOB_DIGEST}"'


@pytest.mark.parametrize(
    "header",
    [
        "bytes=10240-",
        "bytes=99999-100000",
        "bytes=-0",
        "bytes=" + "9" * 30 + "-",
        "bytes=1" + "0" * 19 + "-",
    ],
)
def test_an_unsatisfiable_range_is_416(cdn: Cdn, header: str) -> None:
    publish(cdn, 1)
    response = cdn.client.get(f"/v1/blobs/{BLOB_DIGEST}", headers={"Range": header})
    assert response.status_code == 416
    assert response.headers["content-range"] == f"bytes */{len(BLOB)}"
    assert "not satisfiable" in response.json()["error"]


@pytest.mark.parametrize(
    "header", ["items=0-5", "bytes=0-5,10-20", "bytes=9-3", "bytes=x-", "bytes=-", "bytes"]
)
def test_a_range_we_do_not_honour_gets_the_whole_blob(cdn: Cdn, header: str) -> None:
    publish(cdn, 1)
    response = cdn.client.get(f"/v1/blobs/{BLOB_DIGEST}", headers={"Range": header})
    assert response.status_code == 200
    assert response.content == BLOB


def test_if_range_with_another_etag_gets_the_whole_blob(cdn: Cdn) -> None:
    publish(cdn, 1)
    url = f"/v1/blobs/{BLOB_DIGEST}"
    for stale in (f'"{digest(b"old")}"', f'W/"{BLOB_DIGEST}"', "Mon, 30 Nov 2026 09:00:00 GMT"):
        response = cdn.client.get(url, headers={"Range": "bytes=0-9", "If-Range": stale})
        assert response.status_code == 200, stale
        assert response.content == BLOB
    resumed = cdn.client.get(url, headers={"Range": "bytes=10-", "If-Range": f'"{BLOB_DIGEST}"'})
    assert resumed.status_code == 206
    assert resumed.content == BLOB[10:]


def test_if_none_match_with_the_digest_is_304(cdn: Cdn) -> None:
    publish(cdn, 1)
    url = f"/v1/blobs/{BLOB_DIGEST}"
    for tags in (f'"{BLOB_DIGEST}"', f'"x", W/"{BLOB_DIGEST}"', "*"):
        response = cdn.client.get(url, headers={"If-None-Match": tags})
        assert response.status_code == 304, tags
        assert response.content == b""
        assert response.headers["etag"] == f'"{BLOB_DIGEST}"'
    other = cdn.client.get(url, headers={"If-None-Match": f'"{digest(b"old")}"'})
    assert other.status_code == 200
    assert other.content == BLOB


def test_head_gives_the_headers_without_the_body(cdn: Cdn) -> None:
    publish(cdn, 1)
    url = f"/v1/blobs/{BLOB_DIGEST}"
    whole = cdn.client.head(url)
    assert whole.status_code == 200
    assert whole.content == b""
    assert whole.headers["content-length"] == str(len(BLOB))
    assert whole.headers["etag"] == f'"{BLOB_DIGEST}"'
    part = cdn.client.head(url, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206
    assert part.headers["content-length"] == "100"
    assert part.headers["content-range"] == f"bytes 100-199/{len(BLOB)}"
    assert cdn.client.head(f"/v1/blobs/{digest(b'absent')}").status_code == 404


def test_a_missing_blob_is_404(cdn: Cdn) -> None:
    response = cdn.client.get(f"/v1/blobs/{digest(b'absent')}")
    assert response.status_code == 404
    assert "no blob" in response.json()["error"]


def test_a_5_mb_blob_is_sent_without_reading_it_whole(cdn: Cdn) -> None:
    """The stores fail on ``get``; the local one also on ``open`` (its files go out by
    path through FileResponse), the other records every read (64 KiB chunks at most)."""
    big = bytes(range(251)) * (5 * 1024 * 1024 // 251 + 1)
    publish(cdn, 1, big)
    url = f"/v1/blobs/{digest(big)}"
    with cdn.client.stream("GET", url) as response:
        assert response.status_code == 200
        assert response.headers["content-length"] == str(len(big))
        assert b"".join(response.iter_bytes()) == big
    tail = cdn.client.get(url, headers={"Range": f"bytes={len(big) - 3_000_000}-"})
    assert tail.status_code == 206
    assert tail.content == big[-3_000_000:]
    # a resumed download across several 1 MiB file reads, starting and ending mid-read
    etag = f'"{digest(big)}"'
    middle = cdn.client.get(url, headers={"Range": "bytes=1000000-3200000", "If-Range": etag})
    assert middle.status_code == 206
    assert middle.headers["content-range"] == f"bytes 1000000-3200000/{len(big)}"
    assert middle.content == big[1_000_000:3_200_001]
    if isinstance(cdn.store, StreamOnlyStore):
        assert cdn.store.reads
        assert max(cdn.store.reads) <= 64 * 1024
        assert -1 not in cdn.store.reads  # never "read everything"


# -- range plan -------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        "bytes=0-49",
        "bytes=50-",
        "bytes=-10",
        "bytes=-500",
        "bytes=99-99",
        "bytes= 3 - 7",
        "BYTES=1-2",
    ],
)
def test_our_range_plan_matches_what_file_response_sends(header: str) -> None:
    """Local blobs go out through Starlette's FileResponse, which parses Range itself:
    wherever our plan honours a range, its parser must pick the very same bytes
    (this guards against a Starlette upgrade changing the rules under us)."""
    from starlette.responses import FileResponse

    from model_cdn.http._ranges import plan_range

    planned = plan_range(header, None, '"etag"', 100)
    assert planned is not None
    assert FileResponse._parse_range_header(header, 100) == [(planned.start, planned.end)]
