"""The fleet as the CDN sees it: devices from heartbeats and reports, and the MQTT link.

``FleetView`` (pure) folds device telemetry and update reports into device
records and aggregates health per model version; ``FleetLink`` is the CDN's
MQTT connection that hears those messages and publishes assignments.
"""

from ._link import FleetEvent, FleetLink, LinkStats
from ._view import FleetView, device_view, label_filter

__all__ = [
    "FleetEvent",
    "FleetLink",
    "FleetView",
    "LinkStats",
    "device_view",
    "label_filter",
]
