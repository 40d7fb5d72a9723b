"""One page of the fleet for the console: the devices API's filters, order and paging.

``GET /console/api/devices`` takes (every parameter optional, each at most once
except ``label``)::

    limit=50        devices on the page, 1..500
    offset=0        devices skipped before the page (0..10,000,000)
    label=K=V       the operator's label K is V (repeat for more: all must hold)
    model=NAME      runs the model NAME
    version=N       runs version N of ``model`` (needs ``model``)
    status=S        online | offline (heard from, not within 60 s) | never (labelled,
                    never heard from)
    q=TEXT          every word (case-insensitive) is in the device id, a label
                    ``k=v`` or a ``model@version`` of the device (at most 200 characters)

and answers ``{"devices": [...], "total": matching, "fleet": all devices,
"offset", "limit"}``, devices in id order. Any other parameter, a repeated
one, or a value out of range is a 400 with a one-line error naming it: a
typo must not silently show the whole fleet. Pure: no I/O, no clock (``now``
comes in).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared import validate_name

from ..fleet._view import DEFAULT_ONLINE_S, device_view, label_filter
from ..registry import DeviceRecord

__all__ = ["MAX_LIMIT", "DeviceQuery", "device_page"]

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_OFFSET = 10_000_000
MAX_TEXT = 200
STATUSES = ("online", "offline", "never")
_PARAMS = ("limit", "offset", "label", "model", "version", "status", "q")


def _whole(name: str, text: str, low: int, high: int) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 9:
        raise ValueError(f"{name} is a whole number from {low} to {high}, got {text!r:.40}")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"{name} is a whole number from {low} to {high}, got {value}")
    return value


@dataclass(frozen=True)
class DeviceQuery:
    """What the console asked for; ``parse`` raises ``ValueError`` (one line) on bad input."""

    limit: int = DEFAULT_LIMIT
    offset: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    model: str | None = None
    version: int | None = None
    status: str | None = None
    words: tuple[str, ...] = ()

    @classmethod
    def parse(cls, params: Iterable[tuple[str, str]]) -> DeviceQuery:
        seen: dict[str, list[str]] = {}
        for name, value in params:
            if name not in _PARAMS:
                raise ValueError(f"unknown query parameter {name!r:.40}: use {', '.join(_PARAMS)}")
            seen.setdefault(name, []).append(value)
        for name, values in seen.items():
            if name != "label" and len(values) > 1:
                raise ValueError(
                    f"query parameter {name!r} given {len(values)} times, once at most"
                )
        one = {name: values[0] for name, values in seen.items()}
        model = one.get("model")
        if model is not None:
            validate_name(model, "model name")  # a ConfigError: a ValueError
        version = None
        if "version" in one:
            if model is None:
                raise ValueError("version needs model: ?model=NAME&version=N")
            version = _whole("version", one["version"], 1, 2**31 - 1)
        status = one.get("status")
        if status is not None and status not in STATUSES:
            raise ValueError(f"status is one of {', '.join(STATUSES)}, got {status!r:.40}")
        text = one.get("q", "")
        if len(text) > MAX_TEXT:
            raise ValueError(f"q is at most {MAX_TEXT} characters, got {len(text)}")
        return cls(
            limit=_whole("limit", one["limit"], 1, MAX_LIMIT) if "limit" in one else DEFAULT_LIMIT,
            offset=_whole("offset", one["offset"], 0, MAX_OFFSET) if "offset" in one else 0,
            labels=label_filter(seen.get("label", [])),
            model=model,
            version=version,
            status=status,
            words=tuple(text.lower().split()),
        )

    def matches(self, r: DeviceRecord, now: float, online_s: float = DEFAULT_ONLINE_S) -> bool:
        if self.labels and any(r.labels.get(k) != v for k, v in self.labels.items()):
            return False
        if self.model is not None:
            running = r.models.get(self.model)
            if running is None or (self.version is not None and running != self.version):
                return False
        if self.status is not None:
            online = r.last_seen > 0 and now - r.last_seen <= online_s
            status = "never" if r.last_seen <= 0 else "online" if online else "offline"
            if status != self.status:
                return False
        if self.words:
            hay = " ".join(
                [r.device]
                + [f"{k}={v}" for k, v in r.labels.items()]
                + [f"{m}@{v}" for m, v in r.models.items()]
            ).lower()
            if not all(w in hay for w in self.words):
                return False
        return True


def device_page(
    records: Iterable[DeviceRecord], query: DeviceQuery, now: float, fleet: int
) -> dict[str, Any]:
    """The page ``query`` asks for out of ``records`` (every device, ``fleet`` of them)."""
    chosen = sorted((r for r in records if query.matches(r, now)), key=lambda r: r.device)
    page = chosen[query.offset : query.offset + query.limit]
    return {
        "devices": [device_view(r, now) for r in page],
        "total": len(chosen),
        "fleet": fleet,
        "offset": query.offset,
        "limit": query.limit,
    }
