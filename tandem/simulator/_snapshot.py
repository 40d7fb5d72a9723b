"""``FleetSnapshot``: the simulated fleet at one moment, for tests and the live summary."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ._device import DeviceState

__all__ = ["FleetSnapshot"]


@dataclass(frozen=True)
class FleetSnapshot:
    """The fleet at one moment."""

    at: float  # epoch seconds
    devices: dict[str, DeviceState]
    http_requests: int = 0
    status_reports: int = 0
    telemetry_reports: int = 0
    last_error: str | None = None  # the last connection or download problem, for a person
    versions: Counter[int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "versions", Counter(d.running_version for d in self.devices.values())
        )

    @property
    def total(self) -> int:
        return len(self.devices)

    @property
    def online(self) -> int:
        return sum(d.online for d in self.devices.values())

    @property
    def installing(self) -> int:
        return sum(d.installing_version is not None for d in self.devices.values())

    @property
    def installs(self) -> int:
        return sum(d.installs for d in self.devices.values())

    @property
    def failures(self) -> int:
        return sum(d.failures for d in self.devices.values())

    def count(self, predicate: Callable[[DeviceState], bool]) -> int:
        return sum(1 for d in self.devices.values() if predicate(d))

    def last_states(self) -> Counter[str]:
        """How many devices last reported each update state (``none``: never reported)."""
        return Counter(
            d.last_status.state.value if d.last_status else "none" for d in self.devices.values()
        )

    def summary(self) -> str:
        versions = ", ".join(f"v{v}: {n}" for v, n in sorted(self.versions.items()))
        return (
            f"{self.online}/{self.total} online; {versions}; {self.installs} installed, "
            f"{self.failures} failed, {self.installing} in progress"
        )
