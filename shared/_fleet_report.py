"""Telemetry that devices publish on ``…/dev/{device}/telemetry``, as the fleet reads it.

JSON, one object per report (schema 2)::

    {"type": "telemetry", "schema": 2, "device": "cam-7", "at": 1764500000.0,
     "labels": {"site": "factory-a"}, "capabilities": {"runtime": "onnxruntime"},
     "model": "mnist", "version": 3,
     "requests": 1200, "errors": 1, "offloads": 90, "agreement_samples": 80, "agreed": 78,
     "p50_ms": 1.9, "p99_ms": 7.5}

The counters and latencies describe the edge model version named in the
report since it started serving on the device: a device resets them when it
swaps models, so a rollout can compare versions. ``p50_ms``/``p99_ms`` are
end-to-end latencies over a recent window, ``null`` without samples.

Invariants (checked in the constructor, so a ``DeviceReport`` in hand is valid):
names match ``NAME_PATTERN``; label and capability maps hold at most 32
string entries of at most 128 characters each; counters are non-negative
integers (never booleans) with ``agreed <= agreement_samples``; latencies
are finite and non-negative. Decoding bounds the payload (16 KiB) before
parsing it and ignores unknown keys, so an agent's full metrics object is a
valid report. Every failure is a ``ManifestError`` with a one-line message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ._errors import ManifestError
from ._topics import NAME_PATTERN

__all__ = ["DeviceReport"]

_MAX_BYTES = 16 * 1024
_MAX_ENTRIES = 32
_MAX_TEXT = 128
REPORT_TYPE = "telemetry"
REPORT_SCHEMA = 2
_COUNTERS = ("requests", "errors", "offloads", "agreement_samples", "agreed")


def _bad(what: str, value: object) -> ManifestError:
    return ManifestError(f"telemetry report: bad {what} {value!r:.60}")


def _string_map(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ManifestError(f"telemetry report: {what} must be an object of strings")
    if len(value) > _MAX_ENTRIES:
        raise ManifestError(
            f"telemetry report: {len(value)} {what}; at most {_MAX_ENTRIES} are allowed"
        )
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not 0 < len(key) <= _MAX_TEXT:
            raise _bad(f"{what} name", key)
        if not isinstance(item, str) or len(item) > _MAX_TEXT:
            raise _bad(f"{what} value for {key!r}", item)
        out[key] = item
    return out


def _counter(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _bad(what, value)
    return value


def _latency(value: object, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(what, value)
    ms = float(value)
    if not math.isfinite(ms) or ms < 0:
        raise _bad(what, value)
    return ms


@dataclass(frozen=True, kw_only=True)
class DeviceReport:
    """One device's telemetry report; validated on construction (``ManifestError``)."""

    MAX_BYTES: ClassVar[int] = _MAX_BYTES  # of the JSON document
    MAX_ENTRIES: ClassVar[int] = _MAX_ENTRIES  # labels, and capabilities, each
    MAX_TEXT: ClassVar[int] = _MAX_TEXT  # characters per label or capability name and value

    device: str
    at: float  # seconds since the epoch
    labels: dict[str, str] = field(default_factory=dict)
    capabilities: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    version: int | None = None
    # Since this model version started serving on the device:
    requests: int = 0
    errors: int = 0
    offloads: int = 0
    agreement_samples: int = 0
    agreed: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.device, str) or not NAME_PATTERN.fullmatch(self.device):
            raise _bad("device", self.device)
        at = self.at
        if (
            isinstance(at, bool)
            or not isinstance(at, int | float)
            or not math.isfinite(at)
            or at < 0
        ):
            raise _bad("time 'at'", at)
        object.__setattr__(self, "at", float(at))
        object.__setattr__(self, "labels", _string_map(self.labels, "labels"))
        object.__setattr__(self, "capabilities", _string_map(self.capabilities, "capabilities"))
        if self.model is not None and (
            not isinstance(self.model, str) or not NAME_PATTERN.fullmatch(self.model)
        ):
            raise _bad("model", self.model)
        version = self.version
        if version is not None and (
            not isinstance(version, int) or isinstance(version, bool) or version < 1
        ):
            raise _bad("version", version)
        if version is not None and self.model is None:
            raise ManifestError("telemetry report: a version without a model")
        for name in _COUNTERS:
            _counter(getattr(self, name), name)
        if self.agreed > self.agreement_samples:
            raise ManifestError(
                f"telemetry report: agreed ({self.agreed}) exceeds "
                f"agreement_samples ({self.agreement_samples})"
            )
        object.__setattr__(self, "p50_ms", _latency(self.p50_ms, "p50_ms"))
        object.__setattr__(self, "p99_ms", _latency(self.p99_ms, "p99_ms"))

    @property
    def error_rate(self) -> float | None:
        """``errors / requests``; ``None`` before the first request."""
        return self.errors / self.requests if self.requests else None

    @property
    def offload_rate(self) -> float | None:
        """``offloads / requests``; ``None`` before the first request."""
        return self.offloads / self.requests if self.requests else None

    @property
    def agreement(self) -> float | None:
        """Edge-cloud argmax agreement; ``None`` before the first compared sample."""
        return self.agreed / self.agreement_samples if self.agreement_samples else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": REPORT_TYPE,
            "schema": REPORT_SCHEMA,
            "device": self.device,
            "at": self.at,
            "labels": dict(self.labels),
            "capabilities": dict(self.capabilities),
            "model": self.model,
            "version": self.version,
            "requests": self.requests,
            "errors": self.errors,
            "offloads": self.offloads,
            "agreement_samples": self.agreement_samples,
            "agreed": self.agreed,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceReport:
        """Validate a decoded report object; unknown keys are ignored."""
        if not isinstance(d, Mapping) or d.get("type") != REPORT_TYPE:
            raise ManifestError("a telemetry report is an object with type 'telemetry'")
        schema = d.get("schema")
        if schema != REPORT_SCHEMA or isinstance(schema, bool):
            raise ManifestError(
                f"telemetry report: schema {schema!r:.20} is not supported "
                f"(this build reads {REPORT_SCHEMA})"
            )
        for key in ("device", "at"):
            if key not in d:
                raise ManifestError(f"telemetry report: {key!r} is missing")
        counters = {name: d.get(name, 0) for name in _COUNTERS}
        return cls(
            device=d["device"],
            at=d["at"],
            labels=d.get("labels", {}),
            capabilities=d.get("capabilities", {}),
            model=d.get("model"),
            version=d.get("version"),
            p50_ms=d.get("p50_ms"),
            p99_ms=d.get("p99_ms"),
            **counters,
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> DeviceReport:
        """Parse and validate one report; raises ``ManifestError`` on anything bad."""
        if not isinstance(raw, bytes | bytearray | str):
            raise ManifestError(f"telemetry report must be bytes or text, not {type(raw).__name__}")
        # Characters never outnumber UTF-8 bytes, so the cheap check comes first.
        size = len(raw)
        if size <= _MAX_BYTES and isinstance(raw, str):
            size = len(raw.encode("utf-8", "surrogatepass"))
        if size > _MAX_BYTES:
            raise ManifestError(f"telemetry report over the limit of {_MAX_BYTES} bytes")
        try:
            d = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise ManifestError(f"telemetry report is not JSON: {e}") from e
        return cls.from_dict(d)
