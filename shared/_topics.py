"""MQTT topic scheme.

All topics hang under one prefix (default ``tandem/v1``)::

    {prefix}/dev/{device}/infer/{model}  requests of one device (publishable by it alone);
                                         hubs subscribe $share/{group}/{prefix}/dev/+/infer/+
                                         and answer on that device's reply topic
    {prefix}/infer/{model}             requests, the first layout (kept for a migration
                                         release: the reply goes where the request says)
    {prefix}/dev/{device}/reply        replies for one device
    {prefix}/dev/{device}/generate/{model}  text-generation turns of one device (publishable
                                         by it alone); hubs subscribe
                                         $share/{group}/{prefix}/dev/+/generate/+
    {prefix}/dev/{device}/generate/{model}/{hub}  a conversation's next turn, for the hub
                                         replica that holds its KV cache (sticky); that
                                         replica's ingress processes subscribe
                                         $share/{group}/{prefix}/dev/+/generate/+/{hub}
                                         (its own filter: a shared subscription is its group
                                         and its filter, so replicas never split one)
    {prefix}/dev/{device}/cancel       that device's cancels of its turns; every hub
                                         subscribes {prefix}/dev/+/cancel, not shared: the
                                         replica running the turn must hear it
    {prefix}/dev/{device}/text         the hub's chunks and finals for that device
    {prefix}/dev/{device}/verify/{model}  speculative-decoding rounds of one device
                                         (publishable by it alone); hubs subscribe
                                         $share/{group}/{prefix}/dev/+/verify/+
    {prefix}/dev/{device}/verify/{model}/{hub}  a session's later rounds, for the replica
                                         holding its KV cache (as generate/+/{hub})
    {prefix}/dev/{device}/verified     the hub's verdicts for that device
    {prefix}/dev/{device}/assign       retained: model versions the device should run
    {prefix}/dev/{device}/status       update and health reports
    {prefix}/dev/{device}/telemetry    periodic metrics

Model, device and hub names are one topic level each, so they may not contain
``/``, ``+``, ``#`` or control characters; ``NAME_PATTERN`` is what we accept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._errors import ConfigError

__all__ = ["NAME_PATTERN", "RequestTopic", "Topics", "validate_name"]

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MAX_PREFIX = 256  # characters; MQTT allows 65535 bytes per topic, brokers often far fewer
_WILDCARDS = re.compile(r"[+#$]")


def validate_name(value: object, what: str = "name") -> str:
    """Return ``value`` if it is a valid model or device name, else raise ``ConfigError``."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise ConfigError(
            f"invalid {what} {value!r:.80}: use 1-128 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit"
        )
    return value


@dataclass(frozen=True)
class RequestTopic:
    """What a request topic says: the model, and the device (``None``: the first layout);
    ``hub``: the replica a sticky generate topic names (``None``: any replica)."""

    model: str
    device: str | None = None
    hub: str | None = None


@dataclass(frozen=True)
class Topics:
    """Builds and parses the topics of one Tandem deployment."""

    prefix: str = "tandem/v1"

    def __post_init__(self) -> None:
        prefix = self.prefix
        if (
            not isinstance(prefix, str)
            or not prefix
            or len(prefix) > _MAX_PREFIX
            or not prefix.isprintable()  # control characters, lone surrogates
            or _WILDCARDS.search(prefix)
            or any(not level for level in prefix.split("/"))
        ):
            raise ConfigError(
                f"invalid topic prefix {prefix!r:.80}: use up to {_MAX_PREFIX} characters in "
                "non-empty levels, without + # $ or control characters"
            )

    def infer(self, model: str) -> str:
        return f"{self.prefix}/infer/{validate_name(model, 'model name')}"

    def infer_filter(self, share_group: str | None = None) -> str:
        """The hubs' subscription: shared (``$share/group/…``) when a group is given."""
        topic = f"{self.prefix}/infer/+"
        if share_group is None:
            return topic
        return f"$share/{validate_name(share_group, 'share group')}/{topic}"

    def device_infer(self, device: str, model: str) -> str:
        """The request topic of one device for ``model`` (the layout hubs answer safely)."""
        return self._device(device, f"infer/{validate_name(model, 'model name')}")

    def device_infer_filter(self, share_group: str | None = None) -> str:
        """The hubs' subscription to every device's requests (shared when a group is given)."""
        topic = f"{self.prefix}/dev/+/infer/+"
        if share_group is None:
            return topic
        return f"$share/{validate_name(share_group, 'share group')}/{topic}"

    def parse_request_topic(self, topic: str) -> RequestTopic | None:
        """The model (and device) a request topic names, in either layout; None if neither."""
        model = self.model_from_infer_topic(topic)
        if model is not None:
            return RequestTopic(model)
        head = f"{self.prefix}/dev/"
        if not topic.startswith(head):
            return None
        parts = topic[len(head) :].split("/")
        if len(parts) != 3 or parts[1] != "infer":
            return None
        device, _, model = parts
        if not (NAME_PATTERN.fullmatch(device) and NAME_PATTERN.fullmatch(model)):
            return None
        return RequestTopic(model, device)

    def device_generate(self, device: str, model: str, hub: str | None = None) -> str:
        """The text-generation request topic of one device for ``model``: for any hub
        replica, or (``hub``) for the one replica of that id (sticky)."""
        leaf = f"generate/{validate_name(model, 'model name')}"
        if hub is not None:
            leaf += f"/{validate_name(hub, 'hub id')}"
        return self._device(device, leaf)

    def device_generate_filter(self, share_group: str | None = None) -> str:
        """The hubs' subscription to every device's text turns (shared when a group is given)."""
        topic = f"{self.prefix}/dev/+/generate/+"
        if share_group is None:
            return topic
        return f"$share/{validate_name(share_group, 'share group')}/{topic}"

    def hub_generate_filter(self, hub: str, share_group: str | None = None) -> str:
        """One replica's subscription to the turns sent to it alone (shared by its ingress
        processes when a group is given)."""
        topic = f"{self.prefix}/dev/+/generate/+/{validate_name(hub, 'hub id')}"
        if share_group is None:
            return topic
        return f"$share/{validate_name(share_group, 'share group')}/{topic}"

    def cancel(self, device: str) -> str:
        """Where a device cancels its text turns."""
        return self._device(device, "cancel")

    def cancel_filter(self) -> str:
        """Every hub's subscription to cancels: never shared (the turn's replica must hear it)."""
        return f"{self.prefix}/dev/+/cancel"

    def text(self, device: str) -> str:
        """Where a hub streams a device's chunks and finals (derived, never requested)."""
        return self._device(device, "text")

    def parse_text_topic(self, topic: str) -> RequestTopic | None:
        """The device (and model, and hub) of a generate or cancel topic; None if neither.

        A cancel topic names no model: ``RequestTopic.model`` is ``""`` then; a sticky
        generate topic names the hub replica it is for (``RequestTopic.hub``).
        """
        head = f"{self.prefix}/dev/"
        if not topic.startswith(head):
            return None
        parts = topic[len(head) :].split("/")
        if not NAME_PATTERN.fullmatch(parts[0]):
            return None
        if len(parts) == 2 and parts[1] == "cancel":
            return RequestTopic("", parts[0])
        if len(parts) not in (3, 4) or parts[1] != "generate":
            return None
        if not all(NAME_PATTERN.fullmatch(level) for level in parts[2:]):
            return None
        return RequestTopic(parts[2], parts[0], parts[3] if len(parts) == 4 else None)

    def device_verify(self, device: str, model: str, hub: str | None = None) -> str:
        """Where a device sends speculative rounds for ``model``: to any replica, or
        (``hub``) to the one holding the session's KV cache."""
        leaf = f"verify/{validate_name(model, 'model name')}"
        if hub is not None:
            leaf += f"/{validate_name(hub, 'hub id')}"
        return self._device(device, leaf)

    def device_verify_filter(self, share_group: str | None = None) -> str:
        """The hubs' subscription to every device's first rounds (shared when a group is given)."""
        topic = f"{self.prefix}/dev/+/verify/+"
        if share_group is None:
            return topic
        return f"$share/{validate_name(share_group, 'share group')}/{topic}"

    def hub_verify_filter(self, hub: str, share_group: str | None = None) -> str:
        """One replica's subscription to the rounds sent to it alone."""
        topic = f"{self.prefix}/dev/+/verify/+/{validate_name(hub, 'hub id')}"
        if share_group is None:
            return topic
        return f"$share/{validate_name(share_group, 'share group')}/{topic}"

    def verified(self, device: str) -> str:
        """Where a hub answers a device's rounds (derived, never requested)."""
        return self._device(device, "verified")

    def parse_verify_topic(self, topic: str) -> RequestTopic | None:
        """The device, model (and hub) of a verify topic; None if it is not one."""
        head = f"{self.prefix}/dev/"
        if not topic.startswith(head):
            return None
        parts = topic[len(head) :].split("/")
        if len(parts) not in (3, 4) or parts[1] != "verify":
            return None
        if not all(NAME_PATTERN.fullmatch(level) for level in (parts[0], *parts[2:])):
            return None
        return RequestTopic(parts[2], parts[0], parts[3] if len(parts) == 4 else None)

    def model_from_infer_topic(self, topic: str) -> str | None:
        """The model named by a request topic, or ``None`` if it is not one."""
        head = f"{self.prefix}/infer/"
        if not topic.startswith(head):
            return None
        model = topic[len(head) :]
        return model if NAME_PATTERN.fullmatch(model) else None

    def reply(self, device: str) -> str:
        return self._device(device, "reply")

    def assign(self, device: str) -> str:
        return self._device(device, "assign")

    def status(self, device: str) -> str:
        return self._device(device, "status")

    def telemetry(self, device: str) -> str:
        return self._device(device, "telemetry")

    def _device(self, device: str, leaf: str) -> str:
        return f"{self.prefix}/dev/{validate_name(device, 'device id')}/{leaf}"
