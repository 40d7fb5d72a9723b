"""The fleet as the CDN sees it: devices from heartbeats and reports, and the MQTT link.

``FleetView`` (pure) folds device telemetry and update reports into device
records, believing what only the operator or the server can vouch for; ``FleetLink`` is the CDN's
MQTT connection that hears those messages and publishes assignments.
"""

from ._link import FleetEvent, FleetLink, LinkStats
from ._view import FleetView, Heard, device_view, label_filter, label_map

__all__ = [
    "FleetEvent",
    "FleetLink",
    "FleetView",
    "Heard",
    "LinkStats",
    "device_view",
    "label_filter",
    "label_map",
]
