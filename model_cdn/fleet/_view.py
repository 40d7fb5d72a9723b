"""What the CDN knows about the fleet: devices from their heartbeats and update reports.

Pure: no I/O, no clock (``now`` comes in). ``FleetView`` keeps one
``DeviceRecord`` per device id, folding in telemetry (``DeviceReport``:
capabilities, the edge model serving and its counters) and update status
reports (``UpdateStatus``: the version running after an update). It
remembers which records changed since the last ``take_dirty()`` so the
controller writes only those to the registry, in one batch.

What a device says about itself is a claim; what the view believes (issue:
one device must not be able to forge the fleet's health):

- **labels** (and so a device's site) are the operator's: set with
  ``set_labels`` (``tandem fleet label``, the admin API) or stored in the
  registry. A heartbeat's labels are kept as ``claimed_labels`` for people to
  compare, never used to target; only with ``trust_claimed_labels`` (a lab
  fleet without an inventory) does a device's first claim become its labels;
- **versions** come from update reports; a heartbeat's version is taken only
  for a device the view has no version of yet, else it must match (a
  mismatch is shown as ``version_unverified``, and the rollout controller
  confirms a version only where it assigned it);
- **freshness**: the fleet link drops retained heartbeats before they get
  here (a retained message was stored on the broker some time ago: it says
  nothing about now); with ``stale_after_s`` set, a heartbeat dated more than
  that before it arrived is stale too and changes nothing (off by default:
  devices without a real-time clock date their reports from 1970).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from shared import DeviceReport, UpdateState, UpdateStatus

from ..registry import DeviceRecord

__all__ = ["FleetView", "Heard", "device_view", "label_filter", "label_map"]

DEFAULT_ONLINE_S = 60.0  # a device that reported within this is online


@dataclass(frozen=True)
class Heard:
    """What one heartbeat did: the device's record, whether it is new, whether it counted."""

    record: DeviceRecord | None  # None: a stale heartbeat of a device never heard before
    new: bool
    fresh: bool


def label_filter(selectors: Iterable[str]) -> dict[str, str]:
    """``["site=a", "hw=npu"]`` → ``{"site": "a", "hw": "npu"}``; ``ValueError`` on bad text."""
    out: dict[str, str] = {}
    for text in selectors:
        key, sep, value = str(text).partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"a label selector is NAME=VALUE, got {text!r:.80}")
        out[key.strip()] = value.strip()
    return out


def label_map(body: object) -> dict[str, dict[str, str]]:
    """``{"devices": {id: {name: value}}}`` checked (``ValueError`` naming the problem)."""
    from shared import DeviceReport, validate_name

    devices = body.get("devices") if isinstance(body, Mapping) else None
    if not isinstance(devices, Mapping) or not devices:
        raise ValueError('the body is {"devices": {"<device id>": {"<label>": "<value>"}}}')
    out: dict[str, dict[str, str]] = {}
    for device, labels in devices.items():
        validate_name(device, "device id")
        if not isinstance(labels, Mapping) or len(labels) > DeviceReport.MAX_ENTRIES:
            raise ValueError(
                f"labels of {device}: an object of at most {DeviceReport.MAX_ENTRIES} entries"
            )
        for k, v in labels.items():
            if not isinstance(k, str) or not isinstance(v, str) or not k:
                raise ValueError(f"labels of {device}: names and values are text")
            if len(k) > DeviceReport.MAX_TEXT or len(v) > DeviceReport.MAX_TEXT:
                raise ValueError(f"labels of {device}: at most {DeviceReport.MAX_TEXT} characters")
        out[device] = dict(labels)
    return out


def device_view(
    record: DeviceRecord, now: float, online_s: float = DEFAULT_ONLINE_S
) -> dict[str, Any]:
    """The JSON the admin API returns for one device."""
    t = record.telemetry or {}
    claimed = t.get("labels") if isinstance(t.get("labels"), dict) else None
    return {
        "device": record.device,
        "labels": dict(record.labels),
        "claimed_labels": claimed,
        "labels_differ": claimed is not None and claimed != dict(record.labels),
        "version_unverified": bool(t.get("version_unverified")),
        "capabilities": dict(record.capabilities),
        "models": dict(record.models),
        "first_seen": record.first_seen,
        "last_seen": record.last_seen,
        "online": record.last_seen > 0 and now - record.last_seen <= online_s,
        "telemetry": record.telemetry,
    }


class FleetView:
    """Every device seen or labelled, by id; see the module docstring."""

    def __init__(
        self,
        records: Iterable[DeviceRecord] = (),
        *,
        trust_claimed_labels: bool = False,
        stale_after_s: float | None = None,
    ) -> None:
        self.devices: dict[str, DeviceRecord] = {r.device: r for r in records}
        self.trust_claimed_labels = trust_claimed_labels
        self.stale_after_s = stale_after_s
        self.stale = 0  # heartbeats that arrived too old to count
        self._dirty: set[str] = set()

    def __len__(self) -> int:
        return len(self.devices)

    # ------------------------------------------------------------------ events

    def observe_report(self, report: DeviceReport, now: float) -> Heard:
        """Fold in a heartbeat heard at ``now`` (see the module docstring)."""
        old = self.devices.get(report.device)
        if self.stale_after_s is not None and now - report.at > self.stale_after_s:
            self.stale += 1
            return Heard(old, False, False)
        models = dict(old.models) if old else {}
        telemetry: dict[str, Any] = {**report.to_dict(), "received_at": now}
        if report.model is not None and report.version is not None:
            known = models.get(report.model)
            if known is None:
                models[report.model] = report.version
            elif known != report.version:
                telemetry["version_unverified"] = True
        if old is not None:
            labels = dict(old.labels)
        else:
            labels = dict(report.labels) if self.trust_claimed_labels else {}
        record = DeviceRecord(
            device=report.device,
            labels=labels,
            capabilities=dict(report.capabilities),
            models=models,
            first_seen=old.first_seen if old else now,
            last_seen=now,
            telemetry=telemetry,
        )
        self._put(record)
        return Heard(record, old is None, True)

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

    def confirm_version(self, device: str, model: str, version: int) -> None:
        """The server knows ``device`` runs ``model@version`` (it assigned it, the device
        runs it): what a lost update report would have said."""
        old = self.devices.get(device)
        if old is None or old.models.get(model) == version:
            return
        telemetry = dict(old.telemetry or {})
        telemetry.pop("version_unverified", None)
        self._put(replace(old, models={**old.models, model: version}, telemetry=telemetry))

    def set_labels(self, device: str, labels: Mapping[str, str], now: float) -> DeviceRecord:
        """The operator's labels for ``device`` (replacing any); a device not heard of yet
        gets a record that says so (``last_seen`` 0)."""
        old = self.devices.get(device)
        if old is None:
            record = DeviceRecord(
                device=device,
                labels=dict(labels),
                capabilities={},
                models={},
                first_seen=now,
                last_seen=0.0,
                telemetry=None,
            )
        else:
            record = replace(old, labels=dict(labels))
        self._put(record)
        return record

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

    def _put(self, record: DeviceRecord) -> None:
        self.devices[record.device] = record
        self._dirty.add(record.device)
