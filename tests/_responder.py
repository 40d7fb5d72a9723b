"""A minimal hub stand-in for edge tests: a real paho client on a real broker.

It subscribes to the request topics of both layouts (each device's own,
``…/dev/{device}/infer/{model}``, where agents publish, and the first
``…/infer/{model}``), as the real hub does, and answers each request with whatever its
handler returns (a reply Message, or None for silence). The real hub has its
own tests; this lets edge tests stage exact hub behaviour (overloaded, silent).

A request without tensors is an agent's probe (``edge_agent._cloud_probe``):
it is kept in ``probes``, not ``requests``, and answered as the real hub
answers it (``invalid_input``: the model is served but needs inputs), or not
at all with ``answer_probes=False``. A request for a model outside
``models`` (when given) is answered ``unknown_model``, as the real hub does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt

from shared import (
    ErrorCode,
    Message,
    MqttSettings,
    Topics,
    create_client,
    decode_message,
    encode_message,
)

__all__ = ["Responder"]

Handler = Callable[[Message], Message | None]


class Responder:
    def __init__(
        self,
        broker: str | MqttSettings,
        handler: Handler,
        topics: Topics | None = None,
        *,
        models: frozenset[str] | None = None,
        answer_probes: bool = True,
    ) -> None:
        """``broker``: a URL, or full ``MqttSettings`` (credentials, TLS)."""
        self.topics = topics or Topics()
        self.handler = handler
        self.models = models  # None: every model is served
        self.answer_probes = answer_probes
        self.requests: list[Message] = []
        self.probes: list[Message] = []
        self._settings = (
            broker if isinstance(broker, MqttSettings) else MqttSettings.from_url(broker)
        )
        self._client: Any = None
        self._ready = threading.Event()
        self._refused: Any = None

    def start(self) -> Responder:
        client = create_client(self._settings, f"responder-{id(self):x}", protocol="5")
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.connect(self._settings.host, self._settings.port)
        client.loop_start()
        self._client = client
        if not self._ready.wait(10):
            self.stop()
            raise TimeoutError("responder did not subscribe")
        if self._refused is not None:
            self.stop()
            raise ConnectionRefusedError(f"broker refused the responder: {self._refused}")
        return self

    def stop(self) -> None:
        if self._client is not None:
            self._client.disconnect()
            self._client.loop_stop()
            self._client = None

    def __enter__(self) -> Responder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _on_connect(self, client: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:  # bad credentials, not authorised: fail start() at once
            self._refused = reason
            self._ready.set()
        else:  # ready once subscribed: a request sent before the SUBACK could be missed
            client.subscribe(
                [(self.topics.device_infer_filter(), 1), (self.topics.infer_filter(), 1)]
            )

    def _on_subscribe(self, *_args: Any) -> None:
        self._ready.set()

    def _on_message(self, client: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        request = decode_message(msg.payload)
        probe = not request.tensors
        (self.probes if probe else self.requests).append(request)
        if self.models is not None and request.model not in self.models:
            reply: Message | None = request.reply(
                error=ErrorCode.UNKNOWN_MODEL, error_message=f"no model {request.model!r}"
            )
        elif probe:
            reply = self._probe_reply(request)
        else:
            reply = self.handler(request)
        if reply is not None and request.reply_to:
            client.publish(request.reply_to, encode_message(reply), qos=1)

    def _probe_reply(self, request: Message) -> Message | None:
        """What the real hub says to a probe for a model it serves: it needs inputs."""
        if not self.answer_probes:
            return None
        return request.reply(error=ErrorCode.INVALID_INPUT, error_message="no input tensors")
