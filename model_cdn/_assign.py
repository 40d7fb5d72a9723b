"""Assignments: which model version a device should run, signed and delivered over MQTT.

``make_assignment`` builds and signs the document (pure apart from the clock);
``publish_assignment`` puts it on the device's retained ``…/dev/{device}/assign``
topic at QoS 1, so a device that connects later still finds it, and returns
only once the broker acknowledged it (PUBACK). Each call uses a short-lived
connection of its own: assignments are rare, and a long-lived publisher
would have to survive broker restarts for nothing.

The same document is stored in the registry, where devices poll for it over
HTTP when MQTT is down.
"""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from shared import (
    Assignment,
    MqttSettings,
    SigningKey,
    Topics,
    create_client,
    format_time,
    resolve_protocol,
    sign_document,
)

from ._errors import CdnError

__all__ = ["make_assignment", "publish_assignment"]

_PUBLISH_TIMEOUT_S = 10.0


def make_assignment(
    key: SigningKey,
    *,
    device: str,
    model: str,
    version: int,
    rollback: bool = False,
    rollout: str | None = None,
    ttl_days: float = 30,
) -> dict[str, Any]:
    """A signed assignment, valid from now for ``ttl_days`` (days).

    ``rollback=True`` lets the device go below the highest version it has
    accepted; without it a device refuses a lower version.
    """
    if not isinstance(ttl_days, int | float) or isinstance(ttl_days, bool) or not ttl_days > 0:
        raise CdnError(f"ttl_days must be a positive number of days, got {ttl_days!r}")
    now = datetime.now(UTC).replace(microsecond=0)
    assignment = Assignment(
        device=device,
        model=model,
        version=version,
        rollback=rollback,
        rollout=rollout,
        issued_at=format_time(now),
        expires_at=format_time(now + timedelta(days=ttl_days)),
    )
    return sign_document(assignment.to_dict(), key)


def publish_assignment(
    settings: MqttSettings,
    topics: Topics,
    device: str,
    signed_doc: dict[str, Any],
    *,
    timeout_s: float = _PUBLISH_TIMEOUT_S,
) -> None:
    """Publish ``signed_doc`` retained at QoS 1 on ``topics.assign(device)``; wait for PUBACK.

    Raises ``CdnError`` with one clear line when the broker cannot be reached,
    refuses the connection or the message, or does not acknowledge in time.
    """
    topic = topics.assign(device)
    payload = json.dumps(signed_doc, ensure_ascii=False, separators=(",", ":")).encode()
    where = settings.url
    client = create_client(
        settings, f"tandem-cdn-{uuid.uuid4().hex[:12]}", protocol=resolve_protocol(settings)
    )
    connected = threading.Event()
    acked = threading.Event()
    outcome: dict[str, Any] = {}

    def on_connect(_c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        outcome["connect"] = reason
        connected.set()

    def on_publish(_c: Any, _u: Any, _mid: int, reason: Any, _p: Any) -> None:
        outcome["publish"] = reason
        acked.set()

    def on_disconnect(*_args: Any) -> None:
        connected.set()  # wakes a wait for CONNACK that will not come

    client.on_connect = on_connect
    client.on_publish = on_publish
    client.on_disconnect = on_disconnect
    try:
        client.connect(settings.host, settings.port, keepalive=settings.keepalive_s)
    except (OSError, ValueError) as e:
        raise CdnError(f"cannot reach the MQTT broker at {where}: {e}") from e
    client.loop_start()
    try:
        if not connected.wait(timeout_s) or "connect" not in outcome:
            raise CdnError(f"the MQTT broker at {where} did not accept a connection")
        if outcome["connect"].is_failure:
            raise CdnError(
                f"the MQTT broker at {where} refused the connection: {outcome['connect']}"
            )
        info = client.publish(topic, payload, qos=1, retain=True)
        if info.rc != 0:
            raise CdnError(f"cannot publish to the MQTT broker at {where} (paho error {info.rc})")
        if not acked.wait(timeout_s):
            raise CdnError(f"the MQTT broker at {where} did not acknowledge within {timeout_s:g} s")
        reason = outcome.get("publish")
        if reason is not None and getattr(reason, "is_failure", False):
            raise CdnError(
                f"the MQTT broker at {where} refused the assignment on {topic}: {reason}"
            )
    finally:
        client.disconnect()
        client.loop_stop()
