"""Blob stores (``shared.server.store``): the same behaviour on a local disk and on real S3.

The S3 cases talk HTTP to moto's standalone server on loopback (no in-process
mocking), the way the CDN talks to MinIO or AWS.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import model_cdn
import shared.server.store
from shared import BlobNotFoundError, InvalidStoreKeyError, StoreError, digest
from shared.server.store import BlobStore, LocalBlobStore, S3BlobStore, check_digest, open_store

_CREDENTIALS = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "region_name": "us-east-1",
}
_bucket_numbers = itertools.count()


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on a free loopback port, for this module."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def _client(endpoint: str, **config: Any) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, config=Config(**config), **_CREDENTIALS)


@pytest.fixture
def s3_client(s3_endpoint: str) -> Any:
    return _client(s3_endpoint)


@pytest.fixture
def bucket(s3_client: Any) -> str:
    name = f"blobs-{next(_bucket_numbers)}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "local":
        return LocalBlobStore(tmp_path / "blobs")
    client = request.getfixturevalue("s3_client")
    return S3BlobStore(request.getfixturevalue("bucket"), client=client)


ABSENT = "sha256:" + "0" * 64


# --------------------------------------------------------------------------- both stores


def test_put_then_get_returns_the_bytes_under_their_digest(store: BlobStore) -> None:
    data = b"model bytes \x00\xff" * 100
    name = store.put(data)
    assert name == digest(data)
    assert store.get(name) == data
    assert store.exists(name)
    assert store.size(name) == len(data)


def test_put_of_the_same_bytes_twice_is_a_no_op(store: BlobStore) -> None:
    first = store.put(b"same")
    second = store.put(b"same")
    assert first == second
    assert store.get(first) == b"same"


def test_open_reads_seeks_and_tells(store: BlobStore) -> None:
    data = bytes(range(256)) * 40
    name = store.put(data)
    with store.open(name) as f:
        assert f.read(10) == data[:10]
        assert f.tell() == 10
        f.seek(1000)
        assert f.read(24) == data[1000:1024]
        f.seek(-5, os.SEEK_END)
        assert f.read() == data[-5:]
        assert f.read(3) == b""
        f.seek(0)
        assert f.read() == data


def test_an_absent_blob_is_not_found(store: BlobStore) -> None:
    assert not store.exists(ABSENT)
    with pytest.raises(BlobNotFoundError):
        store.get(ABSENT)
    with pytest.raises(BlobNotFoundError):
        store.size(ABSENT)
    with pytest.raises(BlobNotFoundError):
        store.open(ABSENT)


def test_delete_removes_and_deleting_again_is_a_no_op(store: BlobStore) -> None:
    name = store.put(b"short-lived")
    store.delete(name)
    assert not store.exists(name)
    store.delete(name)
    with pytest.raises(BlobNotFoundError):
        store.get(name)


TRAVERSAL_NAMES = [
    "../x",
    "sha256:../..",
    "sha256:../../etc/passwd",
    "sha256:" + "A" * 64,  # uppercase hex: a second name for the same blob
    "sha256:" + "a" * 63,
    "sha256:" + "a" * 64 + "/../x",
    "sha256:" + "a" * 64 + "\n",
    "/etc/passwd",
    "md5:" + "a" * 32,
    "",
]


@pytest.mark.parametrize("name", TRAVERSAL_NAMES)
def test_path_traversal_names_are_rejected(store: BlobStore, name: str) -> None:
    for method in (store.get, store.open, store.exists, store.size, store.delete, store.local_path):
        with pytest.raises(InvalidStoreKeyError):
            method(name)


def test_check_digest_accepts_only_lowercase_sha256() -> None:
    good = digest(b"x")
    assert check_digest(good) == good
    with pytest.raises(ValueError):  # InvalidStoreKeyError is a ValueError too
        check_digest(good.upper())


# --------------------------------------------------------------------------- local


def test_local_layout_is_sharded_and_served_by_path(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    name = store.put(b"layout")
    hex_digest = name.removeprefix("sha256:")
    path = tmp_path / "sha256" / hex_digest[:2] / hex_digest
    assert path.read_bytes() == b"layout"
    assert store.local_path(name) == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    with pytest.raises(BlobNotFoundError):
        store.local_path(ABSENT)


def test_local_write_is_atomic_no_partial_blob_is_ever_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the moment of the rename the final name is still absent and the temp is complete."""
    store = LocalBlobStore(tmp_path)
    data = os.urandom(100_000)
    final = tmp_path / "sha256" / digest(data)[7:9] / digest(data)[7:]
    seen: list[tuple[bool, bytes, str]] = []
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        seen.append((final.exists(), Path(src).read_bytes(), Path(src).name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    store.put(data)
    assert seen == [(False, data, seen[0][2])]
    assert seen[0][2].startswith(".tmp-")
    assert [p.name for p in final.parent.iterdir()] == [final.name]


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_local_crash_during_write_leaves_no_blob_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    store = LocalBlobStore(tmp_path)

    def fail(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, fail)
    with pytest.raises(StoreError, match="No space left"):
        store.put(b"doomed")
    monkeypatch.undo()
    assert not store.exists(digest(b"doomed"))
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    assert store.put(b"doomed") == digest(b"doomed")  # and a retry works


def test_local_store_on_an_unwritable_root_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"not a directory")
    with pytest.raises(StoreError):
        LocalBlobStore(blocker).put(b"x")


# --------------------------------------------------------------------------- S3


def test_s3_keys_sit_under_the_prefix_and_are_marked_immutable(s3_client: Any, bucket: str) -> None:
    store = S3BlobStore(bucket, prefix="cdn/blobs", client=s3_client)
    name = store.put(b"keyed")
    key = "cdn/blobs/sha256/" + name.removeprefix("sha256:")
    listed = s3_client.list_objects_v2(Bucket=bucket)["Contents"]
    assert [o["Key"] for o in listed] == [key]
    head = s3_client.head_object(Bucket=bucket, Key=key)
    assert "immutable" in head["CacheControl"]
    assert store.local_path(name) is None


def test_s3_open_fetches_ranges_not_the_whole_object(s3_client: Any, bucket: str) -> None:
    store = S3BlobStore(bucket, client=s3_client)
    data = os.urandom(3 * 1024 * 1024 + 17)
    name = store.put(data)
    ranges: list[str | None] = []

    def record(params: dict[str, Any], **kwargs: Any) -> None:
        ranges.append(params.get("Range"))

    s3_client.meta.events.register("provide-client-params.s3.GetObject", record)
    try:
        with store.open(name) as f:
            f.seek(2 * 1024 * 1024 + 5)
            assert f.read(10) == data[2 * 1024 * 1024 + 5 : 2 * 1024 * 1024 + 15]
            f.seek(-7, os.SEEK_END)
            assert f.read() == data[-7:]
    finally:
        s3_client.meta.events.unregister("provide-client-params.s3.GetObject", record)
    assert ranges, "no GET was made"
    assert all(r is not None and r.startswith("bytes=") for r in ranges), ranges
    fetched = 0
    for r in ranges:
        start, end = (int(x) for x in r.removeprefix("bytes=").split("-"))  # type: ignore[union-attr]
        fetched += end - start + 1
    assert fetched < len(data) // 2


def test_s3_missing_bucket_is_a_store_error_not_a_missing_blob(s3_client: Any) -> None:
    store = S3BlobStore("no-such-bucket", client=s3_client)
    with pytest.raises(StoreError) as caught:
        store.put(b"x")
    assert not isinstance(caught.value, BlobNotFoundError)


def test_s3_unreachable_endpoint_is_a_store_error() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = _client(f"http://127.0.0.1:{port}", retries={"max_attempts": 1}, connect_timeout=2)
    with pytest.raises(StoreError):
        S3BlobStore("any", client=client).get(ABSENT)


# --------------------------------------------------------------------------- open_store


def test_open_store_reads_paths_and_file_urls(tmp_path: Path) -> None:
    plain = open_store(str(tmp_path / "a"))
    assert isinstance(plain, LocalBlobStore) and plain.root == tmp_path / "a"
    url = open_store(f"file://{tmp_path}/b")
    assert isinstance(url, LocalBlobStore) and url.root == tmp_path / "b"


def test_open_store_builds_an_s3_store_that_works(
    s3_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    store = open_store(f"s3://{bucket}/models/?endpoint_url={s3_endpoint}&region=us-east-1")
    assert isinstance(store, S3BlobStore)
    assert store.prefix == "models/"
    name = store.put(b"via url")
    assert store.get(name) == b"via url"
    assert isinstance(open_store(f"s3://{bucket}"), S3BlobStore)


@pytest.mark.parametrize(
    "url", ["ftp://host/dir", "s3:///no-bucket", "s3://b/?password=x", "file://otherhost/x", ""]
)
def test_open_store_refuses_what_it_cannot_serve(url: str) -> None:
    with pytest.raises(StoreError):
        open_store(url)


# --------------------------------------------------------------------------- objects


def test_objects_are_written_read_replaced_listed_and_deleted(store: BlobStore) -> None:
    store.put_object("examples/mnist/b.json", b"{}")
    store.put_object("examples/mnist/a.npz", b"first")
    store.put_object("examples/mnist/a.npz", b"second")  # replaced whole
    store.put_object("examples/other/c.npz", b"x" * 10)
    store.put(b"a blob is no object")
    assert store.get_object("examples/mnist/a.npz") == b"second"
    listed = store.list_objects("examples/mnist/")
    assert [(o.key, o.size) for o in listed] == [
        ("examples/mnist/a.npz", 6),
        ("examples/mnist/b.json", 2),
    ]
    assert all(o.modified > 0 for o in listed)
    everything = [o.key for o in store.list_objects()]
    assert everything == ["examples/mnist/a.npz", "examples/mnist/b.json", "examples/other/c.npz"]
    assert [o.key for o in store.list_objects("examples/mn")] == [
        "examples/mnist/a.npz",
        "examples/mnist/b.json",
    ]
    store.delete_object("examples/mnist/a.npz")
    store.delete_object("examples/mnist/a.npz")  # absent: a no-op
    with pytest.raises(BlobNotFoundError):
        store.get_object("examples/mnist/a.npz")
    assert [o.key for o in store.list_objects("examples/")] == [
        "examples/mnist/b.json",
        "examples/other/c.npz",
    ]
    assert store.list_objects("nothing/here/") == []


BAD_KEYS = [
    "",
    "../x",
    "a/../b",
    "/abs",
    "a//b",
    "a/",
    ".hidden",
    "a/.tmp-123",
    "sha256/" + "0" * 64,  # the blobs' area
    "with space",
    "new\nline",
    "a\\b",
    "x" * 600,
]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_object_keys_that_could_leave_the_root_are_refused(store: BlobStore, key: str) -> None:
    for call in (store.get_object, store.delete_object, lambda k: store.put_object(k, b"x")):
        with pytest.raises(InvalidStoreKeyError):
            call(key)


def test_local_objects_are_private_files_and_temporaries_never_listed(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    store.put_object("examples/m/s.npz", b"private")
    path = tmp_path / "examples" / "m" / "s.npz"
    assert path.read_bytes() == b"private"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (tmp_path / "examples" / "m" / ".tmp-half").write_bytes(b"half")
    assert [o.key for o in store.list_objects()] == ["examples/m/s.npz"]


def test_a_store_without_objects_says_so(tmp_path: Path) -> None:
    class BlobsOnly(LocalBlobStore):
        _put_object = BlobStore._put_object  # as a backend written before objects existed

    with pytest.raises(StoreError, match="blobs only"):
        BlobsOnly(tmp_path).put_object("k", b"x")


def test_model_cdn_store_names_are_the_shared_ones() -> None:
    """What model_cdn re-exports of the blob stores is the shared object, never a copy."""
    reexported = sorted(set(shared.server.store.__all__) & set(model_cdn.__all__))
    assert {"BlobStore", "LocalBlobStore", "open_store"} <= set(reexported)
    for name in reexported:
        assert getattr(model_cdn, name) is getattr(shared.server.store, name), name
    assert model_cdn.StoreError is StoreError
    assert model_cdn.BlobNotFoundError is BlobNotFoundError
