"""The rollout service of ``tandem cdn serve``: one fleet link feeding one controller."""

from __future__ import annotations

from typing import Any

from shared import MqttSettings, SigningKey, Topics

from ..fleet import FleetLink
from ..registry import Registry
from ._controller import RolloutController

__all__ = ["FleetService"]


class FleetService:
    """``start()`` connects the link and runs the controller; ``stop()`` undoes both."""

    def __init__(
        self,
        registry: Registry,
        key: SigningKey,
        settings: MqttSettings,
        topics: Topics,
        **controller_options: Any,
    ) -> None:
        self.controller = RolloutController(registry, key, self._publish, **controller_options)
        self.link = FleetLink(settings, topics, self.controller.submit)

    def _publish(self, device: str, document: dict[str, Any]) -> None:
        self.link.publish_retained(device, document)

    def start(self) -> FleetService:
        self.link.start()
        try:
            self.controller.start()
        except BaseException:
            self.link.stop()
            raise
        return self

    def stop(self) -> None:
        self.controller.stop()
        self.link.stop()

    def __enter__(self) -> FleetService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
