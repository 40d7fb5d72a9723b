"""``AssignmentSender``: the one way an assignment leaves the CDN.

Every assignment (a PUT on the admin API, a rollout's waves and rollbacks,
``tandem models assign``) goes the same three steps:

1. signed, by its author (``make_assignment``) or by ``sign`` with the
   sender's key (the rollout controller's online assigning key);
2. stored in the registry as the device's assignment of that model, where
   devices poll for it over HTTP when MQTT is down (``deliver``);
3. published retained at QoS 1 on the device's ``…/dev/{device}/assign``
   topic over the link, the CDN's one MQTT connection (``fleet.FleetLink``),
   so a device that connects later still finds it.

``deliver(…, wait=True)`` (the admin API, ``assign_version``) returns once
the broker acknowledged (PUBACK) and raises ``AssignmentNotPublishedError``
("assignment stored, but not published: …") when it did not.
``wait=False`` (the rollout controller, which must not stall on a broker
that is away) only queues the message: paho sends it again after a
reconnect. Without a link (a server without a broker) assignments are
stored only, and devices poll.

``AssignmentSender(link, key=…)`` publishes over a link someone else owns
(the rollout service's fleet link, which also hears the fleet);
``AssignmentSender.connect(settings, topics)`` opens a publish-only link
of its own, at once or (``lazy=True``) at the first publish, and ``close()``
closes it. The link is anything with ``publish_retained`` (``AssignmentLink``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from shared import MqttSettings, SigningKey, Topics

from ._assign import make_assignment
from ._errors import AssignmentNotPublishedError, BrokerError, CdnError
from .fleet._link import FleetLink

if TYPE_CHECKING:
    from .registry import Registry

__all__ = ["DEFAULT_ACK_TIMEOUT_S", "AssignmentLink", "AssignmentSender"]

DEFAULT_ACK_TIMEOUT_S = 10.0


class AssignmentLink(Protocol):
    """An MQTT connection that puts a document on a device's retained assignment topic."""

    def publish_retained(
        self, device: str, document: Mapping[str, Any], *, wait_s: float | None = None
    ) -> None: ...


class AssignmentSender:
    """See the module docstring. ``link`` None: store only (devices poll)."""

    def __init__(
        self,
        link: AssignmentLink | None = None,
        *,
        key: SigningKey | None = None,
        ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S,
    ) -> None:
        if not ack_timeout_s > 0:
            raise ValueError(f"ack_timeout_s must be > 0 seconds, got {ack_timeout_s!r}")
        self.link, self.key, self.ack_timeout_s = link, key, ack_timeout_s
        self._own: FleetLink | None = None  # the link this sender opened and closes
        self._start_lock = threading.Lock()
        self._closed = False

    @classmethod
    def connect(
        cls,
        settings: MqttSettings,
        topics: Topics,
        *,
        key: SigningKey | None = None,
        ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S,
        lazy: bool = False,
    ) -> AssignmentSender:
        """A sender over a publish-only link of its own (``BrokerError`` if unreachable).

        ``lazy``: connect at the first publish instead (a failed connect is
        then that publish's error, and the next publish tries again).
        """
        link = FleetLink(settings, topics)
        sender = cls(link, key=key, ack_timeout_s=ack_timeout_s)
        sender._own = link
        if not lazy:
            link.start(wait_s=ack_timeout_s)
        return sender

    @property
    def publishes(self) -> bool:
        """Whether assignments go out over MQTT (False: stored only)."""
        return self.link is not None

    def sign(
        self,
        *,
        device: str,
        model: str,
        version: int,
        rollback: bool = False,
        rollout: str | None = None,
        ttl_days: float = 30,
    ) -> dict[str, Any]:
        """A signed assignment (``make_assignment``) with this sender's key."""
        if self.key is None:
            raise CdnError("this assignment sender has no signing key")
        return make_assignment(
            self.key,
            device=device,
            model=model,
            version=version,
            rollback=rollback,
            rollout=rollout,
            ttl_days=ttl_days,
        )

    def deliver(
        self,
        registry: Registry,
        device: str,
        model: str,
        document: Mapping[str, Any],
        *,
        wait: bool = True,
    ) -> bool:
        """Store ``document`` as ``device``'s assignment of ``model``, then publish it.

        Returns whether it was published (False: no link, devices poll).
        ``AssignmentNotPublishedError`` when the broker did not take it; the
        stored assignment stays.
        """
        registry.put_assignment(device, model, dict(document))
        try:
            return self.publish(device, document, wait=wait)
        except BrokerError as e:
            raise AssignmentNotPublishedError(f"assignment stored, but not published: {e}") from e

    def publish(self, device: str, document: Mapping[str, Any], *, wait: bool = True) -> bool:
        """Publish an already stored assignment again (``BrokerError`` when it cannot)."""
        if self.link is None:
            return False
        self._start_own_link()
        self.link.publish_retained(device, document, wait_s=self.ack_timeout_s if wait else None)
        return True

    def close(self) -> None:
        """Close the link this sender opened (a link passed in is its owner's to close)."""
        with self._start_lock:
            self._closed = True
            if self._own is not None:
                self._own.stop()

    def __enter__(self) -> AssignmentSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_own_link(self) -> None:
        own = self._own
        if own is None or own.started:
            return
        with self._start_lock:
            if self._closed:
                raise CdnError("the assignment sender is closed")
            if not own.started:
                own.start(wait_s=self.ack_timeout_s)
