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
    TensorSpec,
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
        inputs=(TensorSpec("image", "FP32", (None, 1, 28, 28)),),
        outputs=(TensorSpec("logits", "FP32", (None, 10)),),
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


def _fine_tuned(old: bytes, seed: int = 1) -> bytes:
    """``old`` with about half of its bytes moved one step up or down: an INT8 fine-tune."""
    rng = np.random.default_rng(seed)
    step = rng.choice(np.array([-1, 0, 0, 1], dtype=np.int16), len(old))
    return (np.frombuffer(old, np.uint8).astype(np.int16) + step).astype(np.uint8).tobytes()


def test_bytediff_delta_is_the_bytewise_difference_mod_256() -> None:
    old, new = bytes([0, 1, 255, 7]), bytes([255, 3, 0, 7])
    delta = make_delta(old, new, method="zstd-bytediff")
    assert decompress_blob(delta, 4) == bytes([255, 2, 1, 0])  # (new - old) mod 256
    assert apply_delta(old, delta, 4, method="zstd-bytediff") == new


@pytest.mark.parametrize("new_size", [3_000, 5_000, 7_000])  # shorter, same, longer
def test_bytediff_delta_pads_or_cuts_the_old_model(new_size: int) -> None:
    rng = np.random.default_rng(new_size)
    old = rng.integers(0, 256, 5_000, dtype=np.uint8).tobytes()
    new = _fine_tuned(old + rng.integers(0, 256, 2_000, dtype=np.uint8).tobytes())[:new_size]
    delta = make_delta(old, new, method="zstd-bytediff")
    assert apply_delta(old, delta, new_size, method="zstd-bytediff") == new
    if new_size > len(old):  # past the old model the base is zero bytes: the diff is new itself
        assert decompress_blob(delta, new_size)[len(old) :] == new[len(old) :]


def test_bytediff_beats_the_patch_on_scattered_small_steps() -> None:
    rng = np.random.default_rng(0)
    old = (rng.normal(0, 20, 20_000).clip(-127, 127).astype(np.int8)).tobytes()
    new = _fine_tuned(old)
    patch = make_delta(old, new, method="zstd-patch")
    diff = make_delta(old, new, method="zstd-bytediff")
    assert apply_delta(old, patch, len(new)) == new
    assert apply_delta(old, diff, len(new), method="zstd-bytediff") == new
    assert len(diff) < 0.7 * len(patch)


def test_bytediff_delta_is_bounded_by_the_declared_size() -> None:
    old = bytes(range(256)) * 40
    new = _fine_tuned(old)
    delta = make_delta(old, new, method="zstd-bytediff")
    with pytest.raises(ManifestError, match="more than"):
        apply_delta(old, delta, len(new) - 1, method="zstd-bytediff")  # cut off, not allocated
    with pytest.raises(ManifestError, match="expands to"):
        apply_delta(old, delta, len(new) + 1, method="zstd-bytediff")
    with pytest.raises(ManifestError, match="not valid zstd"):
        apply_delta(old, b"garbage", len(new), method="zstd-bytediff")
    bomb = compress_blob(bytes(50 * 2**20))  # 50 MiB of zeros in a few KiB
    with pytest.raises(ManifestError, match="more than"):
        apply_delta(old, bomb, len(new), method="zstd-bytediff")
    with pytest.raises(ManifestError, match="unknown delta method"):
        apply_delta(old, delta, len(new), method="bsdiff")
    with pytest.raises(ManifestError, match="unknown delta method"):
        make_delta(old, new, method="bsdiff")


def test_delta_refs_carry_their_method_and_keep_unknown_ones(key: SigningKey) -> None:
    deltas = (
        DeltaRef(2, digest(b"patch"), 5),
        DeltaRef(1, digest(b"diff"), 4, "zstd-bytediff"),
        DeltaRef(1, digest(b"future"), 3, "zstd-xdelta9"),
    )
    doc = sign_document(manifest(deltas=deltas).to_dict(), key)
    wire = json.loads(json.dumps(doc))
    assert [d["compression"] for d in wire["signed"]["deltas"]] == [
        "zstd-patch",
        "zstd-bytediff",
        "zstd-xdelta9",
    ]
    got = verify_manifest(wire, [key.public_key], now=NOW)
    assert got.deltas == deltas
    assert [d.supported for d in got.deltas] == [True, True, False]
    assert DeltaRef.METHODS == ("zstd-patch", "zstd-bytediff")
    old_form = {"from_version": 2, "digest": digest(b"patch"), "size": 5}  # no compression field
    assert DeltaRef.from_dict(old_form) == deltas[0]
    for bad in ("", "Zstd Patch", "../x", 7, None):
        with pytest.raises(ManifestError, match="compression"):
            DeltaRef.from_dict(old_form | {"compression": bad})


def test_smoke_samples_may_be_zstd_compressed_and_old_ones_still_read(key: SigningKey) -> None:
    image = np.zeros((3, 1, 28, 28), np.float32)
    image[:, :, 10:18, 10:18] = 0.5
    plain, packed = encode_sample(image), encode_sample(image, compress=True)
    assert "compression" not in plain and packed["compression"] == "zstd"
    assert len(packed["data"]) < len(plain["data"]) / 10
    tiny = encode_sample(np.arange(3, dtype=np.float32), compress=True)
    assert "compression" not in tiny  # zstd would not make it smaller
    for inputs in (plain, packed):
        doc = sign_document(
            manifest(
                smoke_test={"inputs": {"image": inputs}, "outputs": {"y": tiny}, "atol": 0.1}
            ).to_dict(),
            key,
        )
        got, expected, _ = verify_manifest(doc, [key.public_key], now=NOW).smoke_samples()
        np.testing.assert_array_equal(got["image"], image)
        np.testing.assert_array_equal(expected["y"], np.arange(3, dtype=np.float32))


def test_compressed_samples_cannot_expand_past_their_shape() -> None:
    tiny = encode_sample(np.arange(3, dtype=np.float32))
    zeros = np.zeros((64, 64), np.float32)
    packed = encode_sample(zeros, compress=True)

    def smoke(**inputs: object) -> dict[str, object]:
        return {"inputs": inputs, "outputs": {"y": tiny}}

    with pytest.raises(ManifestError, match="more than"):  # says 32x32, holds 64x64
        manifest(smoke_test=smoke(x=packed | {"shape": [32, 32]}))
    with pytest.raises(ManifestError, match="expands to"):
        manifest(smoke_test=smoke(x=packed | {"shape": [64, 65]}))
    with pytest.raises(ManifestError, match="not valid zstd"):
        manifest(smoke_test=smoke(x=packed | {"data": encode_sample(zeros)["data"]}))
    with pytest.raises(ManifestError, match="compression"):
        manifest(smoke_test=smoke(x=packed | {"compression": "lzma"}))
    with pytest.raises(ManifestError, match="larger than"):  # 4 MiB declared: refused up front
        manifest(smoke_test=smoke(x=packed | {"shape": [1024, 1024]}))
    # each under the per-tensor cap, together over what a manifest's samples may hold
    big = encode_sample(np.zeros((256, 1000), np.float32), compress=True)
    with pytest.raises(ManifestError, match="in all"):
        manifest(smoke_test=smoke(a=big, b=big))


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


def test_claimed_version_reads_unverified_documents_only_as_a_label() -> None:
    from shared import claimed_version

    assert claimed_version(b'{"signed": {"version": 7}, "signatures": []}') == 7
    for raw in (
        b"not json",
        b"[]",
        b'{"signed": {"version": true}}',
        b'{"signed": {"version": 0}}',
        b'{"signed": {"version": "7"}}',
        b"[" * 100_000,
        b" " * (2 * 1024 * 1024),
    ):
        assert claimed_version(raw) is None
