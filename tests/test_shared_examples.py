"""Collected examples as ``shared`` defines them: the edge's answer in a request header, and
shards in a blob store that read back exactly what was written, or not at all.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared import (
    EdgeAnswer,
    ExampleRows,
    ExampleShardError,
    FrameError,
    Message,
    decode_message,
    encode_message,
    input_digests,
    top_classes,
)
from shared.server import ShardManifest, list_shards, load_examples, read_shard, write_shard
from shared.server.store import LocalBlobStore

# --------------------------------------------------------------------------- the edge's answer


def test_an_edge_answer_travels_in_the_request_header_and_back() -> None:
    logits = np.array([[0.1, 2.0, 0.3], [5.0, 0.0, 1.0]], dtype=np.float32)
    answer = EdgeAnswer.of("mnist-edge@3", logits, 0.42, sampled=True)
    assert answer.labels == (1, 0)
    request = Message(kind="request", request_id="r1", model="mnist", extra=answer.header())
    request.tensors = {"image": np.zeros((2, 3), np.float32)}
    decoded = decode_message(encode_message(request))
    assert EdgeAnswer.from_header(decoded.extra) == answer
    assert EdgeAnswer.from_header({}) is None


def test_a_heavy_request_carries_no_labels_and_unknown_fields_are_kept() -> None:
    answer = EdgeAnswer.from_dict({"model": "m@1", "sampled": False, "future": {"x": 1}})
    assert answer.labels is None and answer.score is None
    assert answer.to_dict()["future"] == {"x": 1}


@pytest.mark.parametrize(
    "fields",
    [
        {"model": "no-version"},
        {"model": "a/b@1"},
        {"labels": [1, -1]},
        {"labels": [1.5]},
        {"labels": [True]},
        {"labels": "7"},
        {"labels": list(range(5000))},
        {"score": float("nan")},
        {"score": "high"},
        {"sampled": 1},
    ],
)
def test_a_malformed_edge_answer_is_a_frame_error(fields: dict[str, object]) -> None:
    with pytest.raises(FrameError):
        EdgeAnswer.from_dict(fields)
    with pytest.raises(FrameError):
        EdgeAnswer.from_header({"edge": "not an object"})


def test_top_classes_is_the_argmax_of_the_last_axis_per_row() -> None:
    scores = np.random.default_rng(0).normal(size=(2, 3, 5))
    assert top_classes(scores).tolist() == scores.argmax(-1).reshape(-1).tolist()
    assert top_classes(np.zeros((0, 10))).shape == (0,)


# --------------------------------------------------------------------------- fingerprints


def test_input_digests_depend_on_the_row_not_on_its_batch() -> None:
    rows = np.random.default_rng(1).random((4, 1, 8, 8)).astype(np.float32)
    alone = input_digests({"image": rows[2:3]})
    batch = input_digests({"image": rows})
    assert (batch[2] == alone[0]).all()
    assert len({bytes(d) for d in batch}) == 4
    changed = rows.copy()
    changed[2, 0, 0, 0] += 1.0
    assert not (input_digests({"image": changed})[2] == batch[2]).all()
    as_float64 = input_digests({"image": rows.astype(np.float64)})
    assert not (as_float64[2] == batch[2]).all()  # the dtype is part of the fingerprint


# --------------------------------------------------------------------------- shards


def _rows(n: int, *, keep_inputs: bool = True, seed: int = 0) -> ExampleRows:
    rng = np.random.default_rng(seed)
    images = rng.random((n, 1, 4, 4)).astype(np.float32)
    logits = rng.normal(size=(n, 10)).astype(np.float32)
    scores = rng.random(n).astype(np.float32)
    scores[::3] = np.nan
    return ExampleRows(
        inputs={"image": images, "mask": rng.integers(0, 2, (n, 3)).astype(np.uint8)}
        if keep_inputs
        else {},
        input_sha256=input_digests({"image": images}),
        outputs={"logits": logits},
        cloud_labels=top_classes(logits),
        edge_labels=np.where(np.arange(n) % 4 == 0, -1, rng.integers(0, 10, n)).astype(np.int64),
        edge_scores=scores,
        reasons=["disagree" if i % 2 else "sample" for i in range(n)],
        devices=[f"cam-{i % 3}" for i in range(n)],
        edge_models=["" if i % 5 == 0 else f"mnist-edge@{1 + i % 2}" for i in range(n)],
        cloud_versions=["1"] * n,
        times=1.7e9 + np.arange(n, dtype=np.float64) / 7,
    )


def _same(a: ExampleRows, b: ExampleRows) -> None:
    for name in ("input_sha256", "cloud_labels", "edge_labels", "edge_scores", "times"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        np.testing.assert_array_equal(x, y)  # NaN equals NaN here
    for name in ("inputs", "outputs"):
        x, y = getattr(a, name), getattr(b, name)
        assert set(x) == set(y)
        for k in x:
            assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape
            np.testing.assert_array_equal(x[k], y[k])
    for name in ("reasons", "devices", "edge_models", "cloud_versions"):
        assert getattr(a, name) == getattr(b, name), name


def test_a_shard_reads_back_exactly_what_was_written(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    rows = _rows(50)
    manifest = write_shard(store, "mnist", rows, writer="hub-a/mqtt-0", seq=1, now=1.7e9)
    assert manifest.key.startswith("examples/mnist/20231114T")
    assert manifest.device_rows == (17, 17, 16) and manifest.devices == ("cam-0", "cam-1", "cam-2")
    assert manifest.reasons == {"disagree": 25, "sample": 25}
    listed = list_shards(store, "mnist")
    assert listed == [manifest]
    _same(read_shard(store, listed[0]), rows)
    _same(load_examples(store, model="mnist"), rows)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    keep=st.booleans(),
    devices=st.lists(
        st.text("abcdefgh0123456789-_.", min_size=1, max_size=20).filter(lambda d: d[0] != "."),
        min_size=1,
        max_size=5,
    ),
)
def test_any_rows_round_trip_through_a_shard(
    tmp_path_factory: pytest.TempPathFactory, n: int, seed: int, keep: bool, devices: list[str]
) -> None:
    store = LocalBlobStore(tmp_path_factory.mktemp("shards"))
    rows = _rows(n, keep_inputs=keep, seed=seed)
    rows.devices = [devices[i % len(devices)] for i in range(n)]
    manifest = write_shard(store, "m", rows, writer="w", seq=seed)
    assert manifest.inputs_kept is keep
    _same(read_shard(store, ShardManifest.from_dict(manifest.to_dict())), rows)


def test_shards_join_and_filter_by_edge_model(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    first, second = _rows(10, seed=1), _rows(7, seed=2)
    write_shard(store, "mnist", first, writer="w", seq=1, now=1.7e9)
    write_shard(store, "mnist", second, writer="w", seq=2, now=1.7e9 + 1)
    write_shard(store, "other", _rows(3), writer="w", seq=1)
    joined = load_examples(store, model="mnist")
    _same(joined, ExampleRows.concat([first, second]))
    assert len(load_examples(store)) == 20  # every model
    only = load_examples(store, model="mnist", edge_model="mnist-edge")
    assert set(only.edge_models) == {"mnist-edge@1", "mnist-edge@2"}
    assert len(only) == sum(1 for m in joined.edge_models if m)
    with pytest.raises(ExampleShardError, match="no collected examples"):
        load_examples(store, model="mnist", edge_model="someone-else")


def test_data_without_its_manifest_is_never_read(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    manifest = write_shard(store, "mnist", _rows(5), writer="w", seq=1)
    store.delete_object(manifest.manifest_key)  # as if the writer died before committing
    assert list_shards(store, "mnist") == []


def _written(tmp_path: Path) -> tuple[LocalBlobStore, ShardManifest]:
    store = LocalBlobStore(tmp_path)
    return store, write_shard(store, "mnist", _rows(6), writer="w", seq=1)


def test_damaged_data_is_refused(tmp_path: Path) -> None:
    store, manifest = _written(tmp_path)
    data = bytearray(store.get_object(manifest.data_key))
    data[len(data) // 2] ^= 0xFF
    store.put_object(manifest.data_key, bytes(data))
    with pytest.raises(ExampleShardError, match="does not match its manifest"):
        read_shard(store, manifest)


def _with_data(store: LocalBlobStore, manifest: ShardManifest, data: bytes) -> ShardManifest:
    """Replace a shard's data and re-commit a manifest that vouches for it (a lying writer)."""
    from shared import digest

    store.put_object(manifest.data_key, data)
    document = manifest.to_dict() | {"data": {"bytes": len(data), "sha256": digest(data)}}
    store.put_object(manifest.manifest_key, json.dumps(document).encode())
    return list_shards(store, "mnist")[0]


def test_a_pickled_column_is_refused_not_unpickled(tmp_path: Path) -> None:
    store, manifest = _written(tmp_path)
    columns = dict(np.load(io.BytesIO(store.get_object(manifest.data_key)), allow_pickle=False))
    columns["input.image"] = np.array([object()] * 6, dtype=object)
    buffer = io.BytesIO()
    np.savez(buffer, **columns)
    with pytest.raises(ExampleShardError, match="does not load"):
        read_shard(store, _with_data(store, manifest, buffer.getvalue()))


def test_columns_that_disagree_with_the_manifest_are_refused(tmp_path: Path) -> None:
    store, manifest = _written(tmp_path)
    columns = dict(np.load(io.BytesIO(store.get_object(manifest.data_key)), allow_pickle=False))
    for change, match in [
        ({"device": columns["device"] + 7}, "indexes past"),
        ({"cloud_label": columns["cloud_label"].astype(np.int32)}, "cloud_label is int32"),
        ({"time": columns["time"][:3]}, "other than 6 rows"),
        ({"extra_column": columns["time"]}, "unknown"),
    ]:
        buffer = io.BytesIO()
        np.savez(buffer, **(columns | change))
        with pytest.raises(ExampleShardError, match=match):
            read_shard(store, _with_data(store, manifest, buffer.getvalue()))


def test_a_zip_bomb_is_refused_before_it_is_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, manifest = _written(tmp_path)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("time.npy", b"\0" * 100_001)  # a few hundred bytes, compressed
    monkeypatch.setattr("shared.server._shards.MAX_DECODED_BYTES", 100_000)  # not 1 GiB in a test
    with pytest.raises(ExampleShardError, match="more than the limit"):
        read_shard(store, _with_data(store, manifest, buffer.getvalue()))


@pytest.mark.parametrize(
    "change",
    [
        {"format": 2},
        {"rows": -1},
        {"device_rows": [1]},
        {"devices": "cam-0"},
        {"data": "nowhere"},
        {"model": ""},
    ],
)
def test_a_malformed_manifest_is_refused(tmp_path: Path, change: dict[str, object]) -> None:
    store, manifest = _written(tmp_path)
    store.put_object(manifest.manifest_key, json.dumps(manifest.to_dict() | change).encode())
    with pytest.raises(ExampleShardError):
        list_shards(store, "mnist")


def test_a_manifest_filed_under_another_shard_is_refused(tmp_path: Path) -> None:
    store, manifest = _written(tmp_path)
    store.put_object("examples/mnist/elsewhere.json", store.get_object(manifest.manifest_key))
    with pytest.raises(ExampleShardError, match="names another shard"):
        list_shards(store, "mnist")


def test_uneven_columns_are_refused_when_built() -> None:
    rows = _rows(4)
    with pytest.raises(ExampleShardError, match="columns of 4 rows"):
        ExampleRows(**{**vars(rows), "devices": ["a"]})
    with pytest.raises(ExampleShardError, match="unknown reasons"):
        ExampleRows(**{**vars(rows), "reasons": ["whim"] * 4})
