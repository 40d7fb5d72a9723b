"""A bare paho client standing in for an edge device, for tests of the hub over MQTT."""

from __future__ import annotations

import queue
import threading
import uuid
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt

from shared import Message, MqttSettings, Topics, decode_message, encode_message, new_request_id

__all__ = ["WAIT_S", "Device"]

WAIT_S = 15.0


class Device:
    """A bare paho client standing in for an edge device."""

    def __init__(self, url: str, topics: Topics, *, protocol: int = mqtt.MQTTv5) -> None:
        self.topics = topics
        self.device_id = f"dev-{uuid.uuid4().hex[:8]}"
        self.reply_topic = topics.reply(self.device_id)
        self.replies: queue.Queue[tuple[Message, Any]] = queue.Queue()
        self.subscribed = threading.Event()
        settings = MqttSettings.from_url(url)
        self.client = mqtt.Client(
            callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
            client_id=self.device_id,
            protocol=protocol,
        )
        self.client.on_connect = lambda c, *_: c.subscribe(self.reply_topic, qos=1)
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(1, 1)
        self.client.connect(settings.host, settings.port)
        self.client.loop_start()
        assert self.subscribed.wait(WAIT_S), "the device could not subscribe"

    def _on_message(self, _client: Any, _userdata: Any, message: Any) -> None:
        self.replies.put((decode_message(message.payload), message.properties))

    def request(
        self,
        model: str,
        tensors: dict[str, np.ndarray],
        *,
        own_topic: bool = True,
        retain: bool = False,
        **fields: Any,
    ) -> str:
        """Publish a request: on the device's own topic (``…/dev/{device}/infer/{model}``),
        or with ``own_topic=False`` on the first layout's (a hub's ``legacy_topics``)."""
        fields.setdefault("reply_to", self.reply_topic)
        message = Message(
            kind="request",
            request_id=new_request_id(),
            model=model,
            device_id=self.device_id,
            tensors=tensors,
            **fields,
        )
        topic = (
            self.topics.device_infer(self.device_id, model)
            if own_topic
            else self.topics.infer(model)
        )
        self.publish(topic, encode_message(message), retain=retain)
        return message.request_id

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(WAIT_S)

    def reply(self, request_id: str | None = None) -> Message:
        message, _ = self.reply_with_properties(request_id)
        return message

    def reply_with_properties(self, request_id: str | None = None) -> tuple[Message, Any]:
        message, properties = self.replies.get(timeout=WAIT_S)
        if request_id is not None:
            assert message.request_id == request_id, "replies came out of order"
        return message, properties

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
