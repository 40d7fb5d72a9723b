"""What the examples run against on one machine: a broker, a hub, the demo's models and digits.

Every example takes ``broker_url``: a running broker (the tests pass their
Mosquitto), or ``None`` for an in-process amqtt broker, so each script also
runs alone with nothing installed but the package. The hub serves the demo's
cloud CNN as ``mnist`` (a single hub, so it subscribes without a shared
subscription, which amqtt lacks). The demo's models are built into the cache
on first use (about half a minute on two cores) and loaded from it after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from cloud_hub import Hub
from shared import MqttSettings
from tandem.broker import EmbeddedBroker
from tandem.demo.data import DigitSplits, load_digit_splits
from tandem.demo.models import DemoModels, build_demo_models

__all__ = ["CLOUD_MODEL", "demo_data", "local_broker", "mnist_hub"]

CLOUD_MODEL = "mnist"  # the name the hub serves the cloud CNN under


def demo_data() -> tuple[DemoModels, DigitSplits]:
    """The demo's model pair (cached after the first build) and its digit splits."""
    return build_demo_models(), load_digit_splits()


@contextlib.contextmanager
def local_broker(broker_url: str | None) -> Iterator[MqttSettings]:
    """``broker_url``'s settings, or an in-process amqtt broker's (MQTT 3.1.1) when None."""
    if broker_url is not None:
        yield MqttSettings.from_url(broker_url)
        return
    with EmbeddedBroker() as broker:
        yield MqttSettings.from_url(broker.url, protocol="3.1.1")


@contextlib.contextmanager
def mnist_hub(models: DemoModels, mqtt: MqttSettings | None) -> Iterator[Hub]:
    """The hub serving the cloud CNN as ``mnist``; over MQTT when ``mqtt`` is given."""
    with Hub(models.hub_repository, mqtt=mqtt, share_group=None) as hub:
        yield hub
