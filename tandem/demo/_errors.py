"""What the demo raises when one of its parts does not come up; one tree::

    shared.TandemError
    └── DemoError (RuntimeError)
        └── DeliveryError      the edge model did not reach a device through the CDN
                               (the CDN did not start, a device refused or failed the install)

The embedded broker's ``tandem.broker.BrokerStartError`` (a ``TandemError``)
passes through as it is: it already says what went wrong.

Errors of the packages the demo drives (``CdnError``, ``HubError``,
``EdgeError``) are converted to these at the demo's boundary, with
``raise ... from``, so the CLI reports one line and exits with status 1.
"""

from __future__ import annotations

from shared import TandemError

__all__ = ["DeliveryError", "DemoError"]


class DemoError(TandemError, RuntimeError):
    """The demo could not run: one of its parts did not come up."""


class DeliveryError(DemoError):
    """The edge model did not reach a device through the CDN."""
