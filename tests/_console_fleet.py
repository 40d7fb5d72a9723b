"""What the console tests share: a fleet of thousands of device records written straight
into the registry, a real health judgement with an outlier excluded, and a manifest
carrying the quantization report ``tandem models publish`` writes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from model_cdn.registry import DeviceRecord, Registry
from shared import BlobRef, ModelManifest, SigningKey, digest, format_time, sign_document

from ._cdn import NOW

__all__ = ["SITES", "judged_with_an_outlier", "quantized_manifest_doc", "seed_fleet"]

SITES = ("factory-a", "factory-b", "factory-c")

# What ``tandem models publish --quantize int8-static`` reports (publish._pipeline)
REPORT: dict[str, Any] = {
    "method": "int8-static",
    "format": "QDQ",
    "activations": "QUInt8",
    "weights": "QInt8",
    "reduce_range": True,
    "per_channel": True,
    "calibration": "MinMax",
    "agreement": 0.9912,
    "accuracy": 0.9803,
    "float_accuracy": 0.9811,
    "max_abs_diff": 0.183391,
    "samples": 2000,
    "float_bytes": 1725348,
    "quantized_bytes": 458930,
    "calibration_samples": 256,
    "min_agreement": 0.98,
    "kernel_max_abs_diff": 0.000122,
}


def quantized_manifest_doc(key: SigningKey, name: str, version: int, blob: bytes) -> dict[str, Any]:
    manifest = ModelManifest(
        name=name,
        version=version,
        format="onnx",
        blob=BlobRef(digest(blob), len(blob), len(blob), "none"),
        published_at=format_time(NOW),
        expires_at=format_time(NOW + timedelta(days=30)),
        quantization=dict(REPORT),
    )
    return sign_document(manifest.to_dict(), key)


def seed_fleet(registry: Registry, n: int, now: float) -> None:
    """``n`` devices: three sites, two models' versions; every 10th silent for an hour,
    every 100th labelled and never heard from (``last_seen`` 0)."""
    records = []
    for i in range(n):
        never = i % 100 == 99
        records.append(
            DeviceRecord(
                device=f"cam-{i:05d}",
                labels={"site": SITES[i % 3], "hw": "npu" if i % 2 else "cpu"},
                capabilities={},
                models={} if never else {"mnist-edge": 1 + i % 4 // 3},  # 1, 1, 1, 2
                first_seen=now - 7200,
                last_seen=0.0 if never else now - (3600 if i % 10 == 9 else 5),
                telemetry=None if never else _counters(i),
            )
        )
    registry.upsert_devices(records)


def _counters(i: int) -> dict[str, int]:
    requests = 2000 + 37 * i % 5000
    offloads = requests * (15 + i % 7) // 100
    return {
        "requests": requests,
        "offloads": offloads,
        "agreement_samples": offloads,
        "agreed": offloads * (95 + i % 5) // 100,
        "errors": requests * (i % 3) // 1000,
    }


def judged_with_an_outlier() -> dict[str, Any]:
    """The gates view of a real ``WaveHealth`` after one look: 3 new, 3 control devices,
    ctl-2 agreeing 40% where the others agree 97%."""
    from model_cdn.rollout import RolloutSpec, parse_waves
    from model_cdn.rollout._wave_health import WaveHealth

    spec = RolloutSpec(
        model="mnist-edge",
        version=2,
        previous_version=1,
        waves=parse_waves("50%,all"),
        target={"site": "a"},
        soak_s=10.0,
        looks=2,
        max_soak_s=100.0,
        max_agreement_drop=0.02,
        max_outliers=0.34,
    )
    health = WaveHealth(spec)
    new = ["new-0", "new-1", "new-2"]
    control = ["ctl-0", "ctl-1", "ctl-2"]
    labels = {d: {"site": "a"} for d in new + control}
    health.open(0, 0.0, dict.fromkeys(new, True), [control], labels)
    assert sorted(health.view()["control"]) == control
    for t in (1.0, 30.0):
        for d in new + control:
            n = int(1000 * t / 30)
            agree = 0.40 if d == "ctl-2" else 0.97
            version = 2 if d.startswith("new") else 1
            report = {
                "version": version,
                "requests": n,
                "errors": 0,
                "offloads": n,
                "agreement_samples": n,
                "agreed": int(n * agree),
            }
            health.telemetry(d, report, t)
    health.look(60.0)
    return dict(health.view())
