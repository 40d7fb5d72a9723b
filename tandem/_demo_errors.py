"""What the demo raises when one of its parts does not come up; one tree::

    shared.TandemError
    └── DemoError (RuntimeError)
        ├── BrokerStartError   the embedded MQTT broker did not start (port taken, amqtt)
        └── DeliveryError      the edge model did not reach a device through the CDN
                               (the CDN did not start, a device refused or failed the install)

Errors of the packages the demo drives (``CdnError``, ``HubError``,
``EdgeError``) are converted to these at the demo's boundary, with
``raise ... from``, so the CLI reports one line and exits with status 1.
"""

from __future__ import annotations

from shared import TandemError

__all__ = ["BrokerStartError", "DeliveryError", "DemoError"]


class DemoError(TandemError, RuntimeError):
    """The demo could not run: one of its parts did not come up."""


class BrokerStartError(DemoError):
    """The embedded broker did not come up (port taken, timeout, amqtt error)."""


class DeliveryError(DemoError):
    """The edge model did not reach a device through the CDN."""
