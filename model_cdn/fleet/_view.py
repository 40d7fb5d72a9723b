"""What the CDN knows about the fleet: devices from their heartbeats and update reports.

Pure: no I/O, no clock (``now`` comes in). ``FleetView`` keeps one
``DeviceRecord`` per device id, folding in telemetry (``DeviceReport``:
labels, capabilities, the edge model serving and its counters) and update
status reports (``UpdateStatus``: the version running after an update). It
remembers which records changed since the last ``take_dirty()`` so the
controller writes only those to the registry, in one batch.

Health per model version (what a rollout's health gates compare) aggregates
the latest report of every device whose edge model is ``model@version`` and
that reported within ``max_age_s``:

- ``samples``: requests counted since the version started serving, summed;
- ``error_rate``: errors / requests; ``offload_rate``: offloads / requests;
- ``agreement``: edge-cloud agreements / compared samples;
- ``p99_latency_ms``: the median over devices of their p99 (one slow device
  does not decide, a slow version does).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from shared import DeviceReport, UpdateState, UpdateStatus

from ..registry import DeviceRecord
from ..rollout import HealthMetrics

__all__ = ["FleetView", "device_view", "label_filter"]

DEFAULT_ONLINE_S = 60.0  # a device that reported within this is online


def label_filter(selectors: Iterable[str]) -> dict[str, str]:
    """``["site=a", "hw=npu"]`` → ``{"site": "a", "hw": "npu"}``; ``ValueError`` on bad text."""
    out: dict[str, str] = {}
    for text in selectors:
        key, sep, value = str(text).partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"a label selector is NAME=VALUE, got {text!r:.80}")
        out[key.strip()] = value.strip()
    return out


def device_view(
    record: DeviceRecord, now: float, online_s: float = DEFAULT_ONLINE_S
) -> dict[str, Any]:
    """The JSON the admin API returns for one device."""
    return {
        "device": record.device,
        "labels": dict(record.labels),
        "capabilities": dict(record.capabilities),
        "models": dict(record.models),
        "first_seen": record.first_seen,
        "last_seen": record.last_seen,
        "online": now - record.last_seen <= online_s,
        "telemetry": record.telemetry,
    }


class FleetView:
    """Every device seen, by id; see the module docstring."""

    def __init__(self, records: Iterable[DeviceRecord] = ()) -> None:
        self.devices: dict[str, DeviceRecord] = {r.device: r for r in records}
        self._dirty: set[str] = set()

    def __len__(self) -> int:
        return len(self.devices)

    # ------------------------------------------------------------------ events

    def observe_report(self, report: DeviceReport, now: float) -> tuple[DeviceRecord, bool]:
        """Fold in a heartbeat; returns the record and whether the device is new."""
        old = self.devices.get(report.device)
        models = dict(old.models) if old else {}
        if report.model is not None and report.version is not None:
            models[report.model] = report.version
        record = DeviceRecord(
            device=report.device,
            labels=dict(report.labels),
            capabilities=dict(report.capabilities),
            models=models,
            first_seen=old.first_seen if old else now,
            last_seen=now,
            telemetry={**report.to_dict(), "received_at": now},
        )
        self._put(record)
        return record, old is None

    def observe_status(self, status: UpdateStatus, now: float) -> tuple[DeviceRecord, bool]:
        """Fold in an update report (the running version); returns (record, is new)."""
        old = self.devices.get(status.device)
        models = dict(old.models) if old else {}
        running = status.running_version
        if running is None and status.state is UpdateState.INSTALLED:
            running = status.version
        if running is not None:
            models[status.model] = running
        if old is None:
            record = DeviceRecord(
                device=status.device,
                labels={},
                capabilities={},
                models=models,
                first_seen=now,
                last_seen=now,
                telemetry=None,
            )
        else:
            record = replace(old, models=models, last_seen=now)
        self._put(record)
        return record, old is None

    def take_dirty(self) -> list[DeviceRecord]:
        """The records changed since the last call (for one batched registry write)."""
        dirty, self._dirty = self._dirty, set()
        return [self.devices[d] for d in sorted(dirty)]

    # ----------------------------------------------------------------- queries

    def labels(self) -> dict[str, Mapping[str, str]]:
        return {d: r.labels for d, r in self.devices.items()}

    def select(
        self,
        labels: Mapping[str, str] | None = None,
        model: str | None = None,
        version: int | None = None,
    ) -> list[DeviceRecord]:
        """Devices whose labels include ``labels`` and that run ``model`` (``@version``)."""
        out = []
        for d in sorted(self.devices):
            r = self.devices[d]
            if labels and any(r.labels.get(k) != v for k, v in labels.items()):
                continue
            if model is not None and model not in r.models:
                continue
            if version is not None and (model is None or r.models.get(model) != version):
                continue
            out.append(r)
        return out

    def health(self, model: str, version: int, now: float, max_age_s: float) -> HealthMetrics:
        """Aggregated health of ``model@version`` (module docstring); zero samples if none."""
        requests = errors = offloads = compared = agreed = 0
        p99s: list[float] = []
        for r in self.devices.values():
            t = r.telemetry
            if not t or t.get("model") != model or t.get("version") != version:
                continue
            if now - float(t.get("received_at", r.last_seen)) > max_age_s:
                continue
            requests += int(t.get("requests") or 0)
            errors += int(t.get("errors") or 0)
            offloads += int(t.get("offloads") or 0)
            compared += int(t.get("agreement_samples") or 0)
            agreed += int(t.get("agreed") or 0)
            if t.get("p99_ms") is not None:
                p99s.append(float(t["p99_ms"]))
        return HealthMetrics(
            samples=requests,
            error_rate=errors / requests if requests else None,
            offload_rate=offloads / requests if requests else None,
            agreement=agreed / compared if compared else None,
            p99_latency_ms=statistics.median(p99s) if p99s else None,
        )

    def _put(self, record: DeviceRecord) -> None:
        self.devices[record.device] = record
        self._dirty.add(record.device)
