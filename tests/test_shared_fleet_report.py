"""``shared.DeviceReport``: the telemetry schema the fleet reads from devices."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared import DeviceReport, ManifestError

SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large]


def report_dict(**changes: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "type": "telemetry",
        "schema": 2,
        "device": "cam-7",
        "at": 1764500000.5,
        "labels": {"site": "factory-a", "hw": "npu"},
        "capabilities": {"runtime": "onnxruntime", "provider": "CPUExecutionProvider"},
        "model": "mnist",
        "version": 3,
        "requests": 1200,
        "errors": 6,
        "offloads": 90,
        "agreement_samples": 80,
        "agreed": 78,
        "p50_ms": 1.9,
        "p99_ms": 7.5,
    }
    d.update(changes)
    return d


def encode(d: object) -> bytes:
    return json.dumps(d).encode()


def test_round_trip() -> None:
    report = DeviceReport.from_json(encode(report_dict()))
    assert report.device == "cam-7"
    assert report.labels == {"site": "factory-a", "hw": "npu"}
    assert report.version == 3
    assert report.to_dict() == report_dict()
    assert DeviceReport.from_json(report.to_json()) == report
    assert DeviceReport.from_json(report.to_json().decode()) == report


def test_rates() -> None:
    report = DeviceReport.from_json(encode(report_dict()))
    assert report.error_rate == pytest.approx(6 / 1200)
    assert report.offload_rate == pytest.approx(90 / 1200)
    assert report.agreement == pytest.approx(78 / 80)


def test_rates_are_none_without_data() -> None:
    report = DeviceReport(device="cam-7", at=0.0)
    assert report.error_rate is None
    assert report.offload_rate is None
    assert report.agreement is None
    assert report.to_dict()["model"] is None


def test_minimal_report_uses_defaults() -> None:
    raw = encode({"type": "telemetry", "schema": 2, "device": "cam-7", "at": 5})
    report = DeviceReport.from_json(raw)
    assert report.at == 5.0
    assert isinstance(report.at, float)
    assert report.labels == {} and report.capabilities == {}
    assert report.model is None and report.version is None
    assert report.requests == report.errors == report.offloads == 0
    assert report.p50_ms is None and report.p99_ms is None


def test_unknown_keys_are_ignored() -> None:
    d = report_dict(by_source={"edge": 3}, breaker_state="closed", future_field=[1, 2])
    assert DeviceReport.from_json(encode(d)) == DeviceReport.from_json(encode(report_dict()))


def test_labels_are_copied() -> None:
    labels = {"site": "a"}
    report = DeviceReport(device="cam-7", at=1.0, labels=labels)
    labels["site"] = "b"
    assert report.labels == {"site": "a"}


def test_limits_at_the_edge_are_accepted() -> None:
    labels = {f"k{i}".ljust(128, "x"): "v" * 128 for i in range(32)}
    d = report_dict(labels=labels, capabilities={"runtime": ""}, agreed=80)
    report = DeviceReport.from_json(encode(d))
    assert len(report.labels) == 32
    assert report.agreement == 1.0


REJECTED: list[tuple[str, dict[str, Any]]] = [
    ("wrong-type", report_dict(type="update-status")),
    ("no-type", {k: v for k, v in report_dict().items() if k != "type"}),
    ("schema-1", report_dict(schema=1)),
    ("schema-3", report_dict(schema=3)),
    ("schema-missing", {k: v for k, v in report_dict().items() if k != "schema"}),
    ("schema-bool", report_dict(schema=True)),
    ("schema-string", report_dict(schema="2")),
    ("device-missing", {k: v for k, v in report_dict().items() if k != "device"}),
    ("device-slash", report_dict(device="cam/7")),
    ("device-wildcard", report_dict(device="+")),
    ("device-empty", report_dict(device="")),
    ("device-too-long", report_dict(device="d" * 129)),
    ("device-int", report_dict(device=7)),
    ("at-missing", {k: v for k, v in report_dict().items() if k != "at"}),
    ("at-string", report_dict(at="2026-11-30T09:00:00Z")),
    ("at-bool", report_dict(at=True)),
    ("at-negative", report_dict(at=-1.0)),
    ("labels-list", report_dict(labels=["site"])),
    ("labels-null", report_dict(labels=None)),
    ("labels-int-value", report_dict(labels={"site": 1})),
    ("labels-nested", report_dict(labels={"site": {"a": "b"}})),
    ("labels-empty-name", report_dict(labels={"": "x"})),
    ("labels-long-name", report_dict(labels={"k" * 129: "x"})),
    ("labels-long-value", report_dict(labels={"k": "v" * 129})),
    ("labels-too-many", report_dict(labels={f"k{i}": "v" for i in range(33)})),
    ("capabilities-list", report_dict(capabilities=[])),
    ("capabilities-null-value", report_dict(capabilities={"runtime": None})),
    ("capabilities-too-many", report_dict(capabilities={f"k{i}": "v" for i in range(33)})),
    ("model-slash", report_dict(model="a/b")),
    ("model-int", report_dict(model=3)),
    ("version-zero", report_dict(version=0)),
    ("version-negative", report_dict(version=-2)),
    ("version-float", report_dict(version=3.0)),
    ("version-bool", report_dict(version=True)),
    ("version-string", report_dict(version="3")),
    ("version-without-model", report_dict(model=None)),
    ("requests-negative", report_dict(requests=-1)),
    ("requests-float", report_dict(requests=1.5)),
    ("requests-bool", report_dict(requests=True)),
    ("requests-null", report_dict(requests=None)),
    ("errors-string", report_dict(errors="1")),
    ("offloads-negative", report_dict(offloads=-5)),
    ("agreement_samples-bool", report_dict(agreement_samples=False)),
    ("agreed-negative", report_dict(agreed=-1)),
    ("agreed-above-samples", report_dict(agreed=81)),
    ("p50-negative", report_dict(p50_ms=-0.1)),
    ("p50-string", report_dict(p50_ms="1.0")),
    ("p50-bool", report_dict(p50_ms=True)),
    ("p99-list", report_dict(p99_ms=[1.0])),
]


@pytest.mark.parametrize(("case", "d"), REJECTED, ids=[case for case, _ in REJECTED])
def test_invalid_report_is_rejected(case: str, d: dict[str, Any]) -> None:
    with pytest.raises(ManifestError) as info:
        DeviceReport.from_json(encode(d))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
@pytest.mark.parametrize("key", ["at", "p50_ms", "p99_ms"])
def test_non_finite_numbers_are_rejected(key: str, literal: str) -> None:
    raw = encode(report_dict(**{key: 1.0})).replace(b"1.0", literal.encode(), 1)
    assert literal.encode() in raw
    with pytest.raises(ManifestError):
        DeviceReport.from_json(raw)


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"[]", b"null", b'"telemetry"', b"\xff\xfe", b"[" * 100_00, "{\ud800}"],
    ids=["empty", "truncated", "list", "null", "string", "bad-utf8", "deep", "surrogate"],
)
def test_garbage_is_rejected(raw: bytes | str) -> None:
    with pytest.raises(ManifestError):
        DeviceReport.from_json(raw)


def test_oversized_report_is_rejected_before_parsing() -> None:
    d = report_dict(padding="x" * (16 * 1024))
    with pytest.raises(ManifestError, match="limit"):
        DeviceReport.from_json(encode(d))


def test_oversized_text_counts_bytes_not_characters() -> None:
    # 6000 three-byte characters: under the limit in characters, over it in UTF-8.
    text = json.dumps(report_dict(padding="€" * 6000), ensure_ascii=False)
    assert len(text) < 16 * 1024 < len(text.encode())
    with pytest.raises(ManifestError, match="limit"):
        DeviceReport.from_json(text)


def test_not_bytes_is_rejected() -> None:
    with pytest.raises(ManifestError):
        DeviceReport.from_json(12)  # type: ignore[arg-type]


def test_constructor_validates() -> None:
    with pytest.raises(ManifestError):
        DeviceReport(device="cam-7", at=1.0, requests=-1)
    with pytest.raises(ManifestError):
        DeviceReport(device="cam-7", at=1.0, agreement_samples=1, agreed=2)
    with pytest.raises(ManifestError):
        DeviceReport(device="cam-7", at=float("nan"))


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=140),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=140), children, max_size=40)
    ),
    max_leaves=80,
)
FIELDS = st.sampled_from([*sorted(report_dict()), "extra"])


@settings(max_examples=300, deadline=None, suppress_health_check=SLOW_DATA)
@given(changes=st.dictionaries(FIELDS, JSON_VALUES, max_size=5), drop=st.sets(FIELDS))
def test_fuzzed_fields_only_raise_the_typed_error(changes: dict[str, Any], drop: set[str]) -> None:
    d = {k: v for k, v in report_dict(**changes).items() if k not in drop}
    raw = json.dumps(d).encode()  # NaN and Infinity literals included
    try:
        report = DeviceReport.from_json(raw)
    except ManifestError:
        return
    assert DeviceReport.from_json(report.to_json()) == report


@settings(max_examples=300, deadline=None, suppress_health_check=SLOW_DATA)
@given(raw=st.binary(max_size=512) | st.text(max_size=512))
def test_fuzzed_bytes_only_raise_the_typed_error(raw: bytes | str) -> None:
    with contextlib.suppress(ManifestError):
        DeviceReport.from_json(raw)


@settings(max_examples=200, deadline=None, suppress_health_check=SLOW_DATA)
@given(
    labels=st.dictionaries(st.text(min_size=1, max_size=128), st.text(max_size=128), max_size=32),
    counts=st.lists(st.integers(min_value=0, max_value=2**62), min_size=4, max_size=4),
    p50=st.none() | st.floats(min_value=0, max_value=1e9),
)
def test_valid_reports_round_trip(
    labels: dict[str, str], counts: list[int], p50: float | None
) -> None:
    requests, errors, offloads, samples = counts
    report = DeviceReport(
        device="dev-1",
        at=1.0,
        labels=labels,
        requests=requests,
        errors=errors,
        offloads=offloads,
        agreement_samples=samples,
        agreed=samples // 2,
        p50_ms=p50,
    )
    assert DeviceReport.from_json(report.to_json()) == report
