"""A fleet simulator: many light simulated devices on real MQTT and real CDN downloads.

``FleetSimulator(SimulatorConfig(devices=1000, …))`` connects each device
over its own MQTT connection (one event-loop thread drives them all), lets
it take signed assignments from its retained topic, download and verify the
manifest and blob from the CDN, and report ``UpdateStatus`` and telemetry
like a real device. Each device is made of the edge SDK's own pieces where
they exist: the updater's trust rules (``edge_agent.updater.UpdateTrust``)
decide what it accepts, and its telemetry is an ``edge_agent.AgentMetrics``
snapshot (a ``shared.DeviceReport`` on the wire); URLs come from
``shared.CdnPaths``. Only the model itself is simulated. Some devices can be
told to fail installs, go offline for a while, or run a model that
disagrees with the cloud, or lie in their telemetry, so rollouts are tested
end to end. ``tandem fleet simulate`` is the command-line front end.
``VirtualFleet`` runs the same devices against the CDN's fleet view and
rollout machine on a virtual clock (no network): hundreds of rollouts a minute.
"""

from ._config import SimulatorConfig
from ._device import DeviceState, DeviceTraits
from ._errors import SimulatorError
from ._fleet import FleetSimulator
from ._snapshot import FleetSnapshot
from ._virtual import VirtualFleet, VirtualOutcome

__all__ = [
    "DeviceState",
    "DeviceTraits",
    "FleetSimulator",
    "FleetSnapshot",
    "SimulatorConfig",
    "SimulatorError",
    "VirtualFleet",
    "VirtualOutcome",
]
