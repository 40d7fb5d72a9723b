from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from shared import (
    Assignment,
    BlobRef,
    DeltaRef,
    ExpiredError,
    ManifestError,
    ModelManifest,
    PublicKey,
    SignatureError,
    SigningKey,
    TensorRecord,
    UpdateState,
    UpdateStatus,
    apply_delta,
    canonical_json,
    compress_blob,
    decompress_blob,
    digest,
    encode_sample,
    format_time,
    make_delta,
    sign_document,
    verify_assignment,
    verify_manifest,
    verify_signed,
)

NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def manifest(**overrides: object) -> ModelManifest:
    fields: dict[str, object] = dict(
        name="mnist",
        version=3,
        format="onnx",
        blob=BlobRef(digest(b"model"), 10, 20),
        published_at=format_time(NOW),
        expires_at=format_time(NOW + timedelta(days=30)),
        inputs=(TensorRecord("image", "FP32", (None, 1, 28, 28)),),
        outputs=(TensorRecord("logits", "FP32", (None, 10)),),
        deltas=(DeltaRef(2, digest(b"delta"), 5),),
        quantization={"method": "int8-static", "agreement": 0.99},
        smoke_test={
            "inputs": {"image": encode_sample(np.ones((1, 1, 28, 28), np.float32))},
            "outputs": {"logits": encode_sample(np.arange(10, dtype=np.float32)[None])},
            "atol": 0.01,
        },
    )
    fields.update(overrides)
    return ModelManifest(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def key() -> SigningKey:
    return SigningKey.generate()


def test_signed_manifest_round_trips_and_keeps_unknown_fields(key: SigningKey) -> None:
    doc = sign_document(manifest(extra={"future_field": [1, 2]}).to_dict(), key)
    wire = json.loads(json.dumps(doc))  # what crosses the network
    got = verify_manifest(wire, [key.public_key], now=NOW)
    assert got == manifest(extra={"future_field": [1, 2]})
    inputs, outputs, atol = got.smoke_samples()
    np.testing.assert_array_equal(outputs["logits"], np.arange(10, dtype=np.float32)[None])
    assert inputs["image"].shape == (1, 1, 28, 28) and atol == 0.01


def test_tampered_manifest_is_refused(key: SigningKey) -> None:
    doc = sign_document(manifest().to_dict(), key)
    doc["signed"]["blob"]["digest"] = digest(b"evil")
    with pytest.raises(SignatureError, match="tampered"):
        verify_manifest(doc, [key.public_key], now=NOW)


def test_manifest_signed_by_unknown_key_is_refused(key: SigningKey) -> None:
    doc = sign_document(manifest().to_dict(), SigningKey.generate())
    with pytest.raises(SignatureError, match="no trusted key"):
        verify_manifest(doc, [key.public_key], now=NOW)


def test_unsigned_manifest_is_refused(key: SigningKey) -> None:
    with pytest.raises(SignatureError, match="not signed"):
        verify_manifest({"signed": manifest().to_dict(), "signatures": []}, [key.public_key])


def test_expired_manifest_is_refused(key: SigningKey) -> None:
    doc = sign_document(manifest().to_dict(), key)
    with pytest.raises(ExpiredError):
        verify_manifest(doc, [key.public_key], now=NOW + timedelta(days=31))


def test_unknown_major_spec_version_is_refused(key: SigningKey) -> None:
    data = manifest().to_dict() | {"spec_version": "2.0"}
    with pytest.raises(ManifestError, match="spec_version"):
        verify_manifest(sign_document(data, key), [key.public_key], now=NOW)
    newer_minor = manifest().to_dict() | {"spec_version": "1.7"}
    assert verify_manifest(sign_document(newer_minor, key), [key.public_key], now=NOW)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("name", "../etc", "name"),
        ("version", 0, "version"),
        ("format", "pickle", "format"),
        ("expires_at", "2026-11-29T00:00:00Z", "after"),
        ("expires_at", "tomorrow", "YYYY"),
    ],
)
def test_invalid_fields_are_refused(field: str, value: object, fragment: str) -> None:
    with pytest.raises(ManifestError, match=fragment):
        ModelManifest.from_dict(manifest().to_dict() | {field: value})


def test_bad_blob_refs_and_samples_are_refused() -> None:
    with pytest.raises(ManifestError, match="digest"):
        BlobRef.from_dict({"digest": "sha256:../../x", "size": 1, "raw_size": 1})
    bad_sample = {"datatype": "FP32", "shape": [2, 2], "data": "AAAA"}
    smoke = {"inputs": {"x": bad_sample}, "outputs": {"y": bad_sample}}
    with pytest.raises(ManifestError, match="do not fill"):
        manifest(smoke_test=smoke)


def test_assignment_signing_and_rollback_flag(key: SigningKey) -> None:
    assignment = Assignment(
        device="cam-7",
        model="mnist",
        version=2,
        rollback=True,
        issued_at=format_time(NOW),
        expires_at=format_time(NOW + timedelta(days=1)),
    )
    got = verify_assignment(sign_document(assignment.to_dict(), key), [key.public_key], now=NOW)
    assert got == assignment and got.rollback
    forged = sign_document(assignment.to_dict(), key)
    forged["signed"]["device"] = "cam-8"
    with pytest.raises(SignatureError):
        verify_assignment(forged, [key.public_key], now=NOW)


def test_keys_round_trip_as_text(key: SigningKey) -> None:
    again = SigningKey.from_text(key.to_text())
    assert again.public_key == key.public_key
    assert PublicKey.from_text(key.public_key.to_text()).keyid == key.public_key.keyid
    with pytest.raises(ManifestError):
        PublicKey.from_text("rsa:abc")


def test_threshold_needs_distinct_trusted_keys(key: SigningKey) -> None:
    other = SigningKey.generate()
    doc = sign_document({"a": 1}, key, key)  # the same key twice counts once
    with pytest.raises(SignatureError):
        verify_signed(doc, [key.public_key, other.public_key], threshold=2)
    assert verify_signed(
        sign_document({"a": 1}, key, other), [key.public_key, other.public_key], threshold=2
    ) == {"a": 1}


def test_canonical_json_is_order_independent_and_refuses_nan() -> None:
    assert canonical_json({"b": 1, "a": [1, 2]}) == canonical_json({"a": [1, 2], "b": 1})
    with pytest.raises(ManifestError):
        canonical_json({"x": float("nan")})


def test_blob_codec_is_bounded_by_the_declared_size() -> None:
    raw = bytes(range(256)) * 64
    packed = compress_blob(raw)
    assert decompress_blob(packed, len(raw)) == raw
    with pytest.raises(ManifestError, match="more than"):
        decompress_blob(packed, len(raw) - 1)  # a bomb is cut off at the declared size
    with pytest.raises(ManifestError, match="expands to"):
        decompress_blob(packed, len(raw) + 1)
    with pytest.raises(ManifestError, match="not valid zstd"):
        decompress_blob(b"garbage", 10)


def test_delta_rebuilds_the_new_model_exactly_and_is_small() -> None:
    rng = np.random.default_rng(0)
    old = rng.integers(0, 256, 50_000, dtype=np.uint8).tobytes()
    new = bytearray(old)
    new[1000:1100] = bytes(100)
    delta = make_delta(old, bytes(new))
    assert apply_delta(old, delta, len(new)) == bytes(new)
    assert len(delta) < len(compress_blob(bytes(new))) / 10
    with pytest.raises(ManifestError):
        apply_delta(old[:-1] + b"x", delta, len(new) - 5)


def test_status_report_round_trip_and_garbage() -> None:
    status = UpdateStatus(
        device="cam-7",
        model="mnist",
        version=3,
        state=UpdateState.FAILED,
        at=format_time(NOW),
        reason="digest mismatch",
        running_version=2,
    )
    assert UpdateStatus.from_json(status.to_json()) == status
    for bad in (b"[]", b"{", b'{"type": "update-status", "device": "../x"}', b"x" * 20000):
        with pytest.raises(ManifestError):
            UpdateStatus.from_json(bad)
