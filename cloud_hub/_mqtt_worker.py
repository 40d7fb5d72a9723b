"""The MQTT side of the hub: take requests off the broker, answer every one it can.

Threads and what each may do:

- paho's network thread runs ``_on_message``: it decodes the frame (bounded
  by ``Limits``; never unpickles or evaluates anything), computes the
  request's deadline from ``timeout_ms`` at receipt (a relative budget, so
  clocks need not agree), hands the tensors to ``submit`` (which only
  checks and queues) and returns. Nothing there blocks on compute. A request
  refused at once (bad frame, unknown model, full queue) is answered there.
- the batcher's thread answers a computed request in its future's
  done-callback: it encodes the reply and publishes it with QoS 1 to the
  request's ``reply_to``. paho's ``publish`` only queues the packet for the
  network thread (it is thread-safe and never waits for the broker), so this
  costs the batcher an encode per request and no thread hand-off: one fewer
  wake-up per request than a reply thread of its own, which on a busy
  machine (every hop waits for the GIL and a core) was most of a reply's
  time in the hub.

Every failure a request can meet (garbage bytes, a bad header, an unknown
model, wrong dtype or shape, an oversized tensor, a full queue, an expired
deadline, the model raising) becomes an error reply with its ``ErrorCode``
when the frame names a reply topic (``_wire.salvage_target`` reads it from
frames that do not decode), else it is logged and dropped. An exception in a
callback is logged, never raised: paho would end its network thread.

The subscription is ``topics.infer_filter(share_group)``: a shared
subscription (``$share/hubs/...``) spreads requests over hub replicas, each
delivered to one; ``share_group=None`` subscribes plainly, for brokers
without shared subscriptions. paho reconnects with backoff
(``connect_async`` + ``loop_start``); ``_on_connect`` subscribes again on every
connection because sessions are not kept. On MQTT 5 connections a reply also
carries a message expiry equal to the time left, and the request's correlation
data when it had some (MQTT 5 request/response); the envelope carries the id
either way. These properties are packed by hand (``shared.publish_properties``):
paho's ``Properties`` class costs more per message than the rest of a publish.

``on_reply`` (optional) hears of every reply just before it is published,
on the thread that publishes it, so metrics count a request by what its
device is told (the hub passes ``HubMetrics.record``); an exception there is
logged, never raised, and the reply still goes out.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from shared import (
    ErrorCode,
    Limits,
    Message,
    MqttSettings,
    Topics,
    create_client,
    decode_message,
    encode_message,
    publish_properties,
    resolve_protocol,
)

from ._batcher import InferenceResult
from ._errors import BadRequestError, BrokerError, HubError, HubStoppingError, error_code
from ._wire import (
    ReplyTarget,
    error_reply,
    reply_topic_allowed,
    salvage_target,
    timing_ms,
)

if TYPE_CHECKING:
    import paho.mqtt.client as paho

__all__ = ["MqttWorker", "ReplyObserver", "SubmitFn"]

log = logging.getLogger(__name__)

SubmitFn = Callable[
    [str, str | None, Mapping[str, np.ndarray], float | None],
    concurrent.futures.Future[InferenceResult],
]
"""``submit(model, version, inputs, deadline)``: queue a request or raise ``HubError``."""


class ReplyObserver(Protocol):
    """Told of each reply: its request's model and version, receipt time, code and result."""

    def __call__(
        self,
        model: str,
        version: str | None,
        *,
        received: float,
        error: ErrorCode,
        result: InferenceResult | None,
    ) -> None: ...


Outcome = concurrent.futures.Future[InferenceResult] | BaseException


class MqttWorker:
    """Serves inference requests from an MQTT broker through ``submit``."""

    def __init__(
        self,
        submit: SubmitFn,
        *,
        mqtt: MqttSettings,
        topics: Topics | None = None,
        share_group: str | None = "hubs",
        limits: Limits | None = None,
        client_id: str | None = None,
        protocol: Literal["5", "3.1.1"] | None = None,
        max_inflight_replies: int = 256,
        on_reply: ReplyObserver | None = None,
    ) -> None:
        self._submit = submit
        self._on_reply = on_reply
        self.settings = mqtt
        self.topics = topics or Topics()
        self.limits = limits or Limits()
        self.subscription = self.topics.infer_filter(share_group)
        self.client_id = client_id or (
            f"tandem-hub-{socket.gethostname()[:24]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self.protocol = protocol  # None: ask the broker at start
        self.max_inflight_replies = max_inflight_replies
        self.subscribed = threading.Event()
        self._client: paho.Client | None = None
        self._unacked: deque[Any] = deque(maxlen=4096)  # MQTTMessageInfo of recent replies
        self._paused = False
        self._closing = False
        # One Counter per counting thread (paho's, each batcher's), summed by ``stats``: a
        # shared lock here was taken twice per request by two threads, and a thread that
        # lost the GIL while holding it made the other wait for a switch interval.
        self._local = threading.local()
        self._counters: list[Counter[str]] = []

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, *, wait_s: float | None = 10.0) -> MqttWorker:
        """Connect (in the background, retrying) and subscribe.

        With ``wait_s``, block until the subscription is granted and raise
        ``BrokerError`` (after cleaning up) if it is not within that time;
        with ``None``, return at once and keep retrying.
        """
        if self._client is not None:
            return self
        if self.protocol is None:
            self.protocol = resolve_protocol(self.settings)
        client = create_client(self.settings, self.client_id, protocol=self.protocol)
        client.max_inflight_messages_set(self.max_inflight_replies)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        self._client = client
        try:
            client.connect_async(self.settings.host, self.settings.port, self.settings.keepalive_s)
        except (OSError, ValueError) as e:
            self.stop()
            raise BrokerError(f"cannot connect to {self.settings.url}: {e}") from e
        client.loop_start()
        log.info(
            "hub %s connecting to %s (MQTT %s), subscribing to %s",
            self.client_id,
            self.settings.url,
            self.protocol,
            self.subscription,
        )
        if wait_s is not None and not self.subscribed.wait(wait_s):
            self.stop(timeout_s=1.0)
            raise BrokerError(
                f"no subscription to {self.subscription} on {self.settings.url} within {wait_s}s "
                "(broker down, credentials refused, or shared subscriptions unsupported?)"
            )
        return self

    def pause(self) -> None:
        """Stop taking new requests (unsubscribe) while replies keep flowing."""
        self._paused = True
        self.subscribed.clear()
        if self._client is not None and self._client.is_connected():
            self._client.unsubscribe(self.subscription)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Wait for the acks of the replies sent, then disconnect.

        Replies are published as requests finish, so stop the batchers first
        (``Hub.stop`` does): they answer what they hold before this waits.
        """
        if self._closing:
            return
        self.pause()
        self._closing = True
        deadline = time.monotonic() + timeout_s
        client = self._client
        if client is None:
            return
        for info in list(self._unacked):
            left = deadline - time.monotonic()
            if left <= 0 or not client.is_connected():
                break
            with contextlib.suppress(RuntimeError, ValueError):  # never queued: no wait
                info.wait_for_publish(left)
        client.disconnect()
        client.loop_stop()
        self._client = None
        log.info("hub %s disconnected from %s", self.client_id, self.settings.url)

    def stats(self) -> dict[str, int]:
        """Counters: received, replied_ok, replied_<error code>, dropped, publish_failed."""
        total: Counter[str] = Counter()
        for counts in list(self._counters):
            total.update(dict(counts))  # dict(): one C call, a consistent copy
        return dict(total)

    def _count(self, what: str) -> None:
        counts: Counter[str] | None = getattr(self._local, "counts", None)
        if counts is None:
            counts = self._local.counts = Counter()
            self._counters.append(counts)
        counts[what] += 1  # only this thread writes it

    # -- paho callbacks (network thread: decode, hand off, return) -----------------------

    def _on_connect(
        self, client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        if reason.is_failure:
            log.error("broker %s refused the hub: %s", self.settings.url, reason)
            return
        log.info("connected to %s", self.settings.url)
        if not self._paused:
            client.subscribe(self.subscription, qos=1)

    def _on_connect_fail(self, _client: Any, _userdata: Any) -> None:
        log.warning("cannot reach the broker %s; retrying", self.settings.url)

    def _on_subscribe(
        self, _client: Any, _userdata: Any, _mid: int, codes: Any, _props: Any
    ) -> None:
        failed = [c for c in codes if c.is_failure]
        if failed:
            log.error(
                "broker refused the subscription %s: %s%s",
                self.subscription,
                failed[0],
                " (no shared subscriptions? run with share_group=None / --no-share)"
                if self.subscription.startswith("$share/")
                else "",
            )
            return
        if not self._paused:
            self.subscribed.set()
            log.info("subscribed to %s", self.subscription)

    def _on_disconnect(self, _c: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
        self.subscribed.clear()
        if not self._closing:
            log.warning("lost the broker %s (%s); reconnecting", self.settings.url, reason)

    def _on_message(self, _client: Any, _userdata: Any, message: Any) -> None:
        try:
            self._handle(message.topic, bytes(message.payload), message.properties)
        except Exception:  # paho would end its network thread: log and go on
            log.exception("unexpected error handling a message on %s", message.topic)

    def _handle(self, topic: str, payload: bytes, properties: Any) -> None:
        received = time.monotonic()
        self._count("received")
        topic_model = self.topics.model_from_infer_topic(topic)
        response_topic = getattr(properties, "ResponseTopic", None) if properties else None
        correlation = getattr(properties, "CorrelationData", None) if properties else None
        try:
            request = decode_message(payload, self.limits)
        except Exception as e:  # ProtocolError family; anything else is still the frame's fault
            target = salvage_target(
                payload,
                limits=self.limits,
                topics=self.topics,
                topic_model=topic_model,
                received=received,
                response_topic=response_topic,
                correlation_data=correlation,
            )
            self._reject(target, e, topic)
            return
        if request.kind != "request":
            self._drop(f"a {request.kind} on request topic {topic}")
            return
        reply_to = request.reply_to or response_topic
        if not reply_topic_allowed(reply_to, self.topics):
            self._drop(f"request {request.request_id} on {topic}: no usable reply topic")
            return
        assert reply_to is not None
        target = ReplyTarget.of(request, reply_to, received, correlation)
        if topic_model != request.model:
            self._reject(
                target,
                BadRequestError(
                    f"header names model {request.model!r} but it came on topic {topic}"
                ),
                topic,
            )
            return
        try:
            future = self._submit(
                request.model, request.model_version, request.tensors, target.deadline
            )
        except Exception as e:  # HubError: typed; anything else: INTERNAL, the hub goes on
            self._reject(target, e, topic)
            return
        future.add_done_callback(lambda f: self._answer(target, f))

    def _reject(self, target: ReplyTarget | None, error: BaseException, topic: str) -> None:
        if target is None:
            self._drop(f"undecodable frame on {topic} with no reply topic: {error}")
        else:
            self._answer(target, error)

    def _drop(self, why: str) -> None:
        self._count("dropped")
        log.warning("dropped %s", why)

    # -- replies (the batcher's thread, or paho's for requests refused at once) ------------

    def _answer(self, target: ReplyTarget, outcome: Outcome) -> None:
        """Encode and publish the reply to one request; never raises (it runs in callbacks)."""
        try:
            encoded = self._reply_for(target, outcome)
            self._observe(target, encoded[0], outcome)
            self._publish(target, encoded)
        except Exception:
            log.exception(
                "could not reply to request %s", target.request_id, extra=_context(target)
            )

    def _observe(self, target: ReplyTarget, reply: Message, outcome: Outcome) -> None:
        if self._on_reply is None:
            return
        result = None
        if reply.error is ErrorCode.OK and isinstance(outcome, concurrent.futures.Future):
            result = outcome.result(timeout=0)  # an OK reply was built from this result
        try:
            self._on_reply(
                target.model,
                target.model_version,
                received=target.received,
                error=reply.error,
                result=result,
            )
        except Exception:
            log.exception(
                "on_reply failed for request %s", target.request_id, extra=_context(target)
            )

    def _reply_for(self, target: ReplyTarget, outcome: Outcome) -> tuple[Message, bytes]:
        if isinstance(outcome, concurrent.futures.Future):
            try:
                result = outcome.result(timeout=0)
            except concurrent.futures.CancelledError:
                outcome = HubStoppingError("the request was cancelled before compute")
            except Exception as e:
                outcome = e
            else:
                reply = Message(
                    kind="reply",
                    request_id=target.request_id,
                    model=target.model,
                    model_version=result.model_version,
                    device_id=target.device_id,
                    tensors=result.outputs,
                    timing=timing_ms(
                        target,
                        time.monotonic(),
                        queue_ms=result.queue_ms,
                        compute_ms=result.compute_ms,
                    ),
                )
                try:
                    return reply, encode_message(reply)
                except Exception as e:  # an output the codec cannot carry
                    outcome = HubError(f"cannot encode the model's outputs: {e}")
        assert isinstance(outcome, BaseException)
        code = error_code(outcome)
        if code is ErrorCode.INTERNAL:  # a model failure (HubError) is expected; a bug is not
            level = logging.WARNING if isinstance(outcome, HubError) else logging.ERROR
            log.log(
                level, "request %s failed: %r", target.request_id, outcome, extra=_context(target)
            )
        reply = error_reply(
            target,
            code,
            str(outcome) or type(outcome).__name__,
            timing_ms(target, time.monotonic()),
        )
        return reply, encode_message(reply)

    def _publish(self, target: ReplyTarget, encoded: tuple[Message, bytes]) -> None:
        reply, payload = encoded
        client = self._client
        if client is None:
            return
        properties = None
        if self.protocol == "5":
            properties = publish_properties(
                correlation_data=target.correlation_data,
                expiry_interval_s=target.expiry_interval_s(time.monotonic()),
            )
        info = client.publish(target.reply_to, payload, qos=1, properties=properties)
        if info.rc:
            self._count("publish_failed")
            log.warning(
                "reply to %s not sent (rc %s)", target.request_id, info.rc, extra=_context(target)
            )
            return
        self._unacked.append(info)
        self._count("replied_" + reply.error.value)


def _context(target: ReplyTarget) -> dict[str, str | None]:
    """Log-record context (``extra=``) naming one request, for JSON logs."""
    return {
        "request_id": target.request_id,
        "device": target.device_id,
        "model": target.model,
        "model_version": target.model_version,
    }
