"""The MQTT side of the hub: take requests off the broker, answer every one it can.

``MqttFront`` sits between an MQTT session (``shared.MqttSession``: paho, or
awscrt's client in the hub's ingress processes) and a ``Dispatcher`` (the
in-process batchers, or the executor processes). On the session's thread,
``_handle`` decodes a frame (bounded by ``Limits``; never unpickles or
evaluates anything), computes the request's deadline from ``timeout_ms`` at
receipt (a relative budget, so clocks need not agree), and hands the tensors
to ``dispatcher.submit``, which only checks and queues. A request refused at
once (bad frame, unknown model, invalid input, full queue) is answered
there; a computed one is answered from ``done``, on whichever thread the
dispatcher finishes on (a batcher's, or the thread reading the executors'
replies). ``session.publish`` only queues the packet, so answering costs an
encode and no wait.

Every failure a request can meet (garbage bytes, a bad header, an unknown
model, wrong dtype or shape, an oversized tensor, a full queue, an expired
deadline, the model raising, an executor restarting) becomes an error reply
with its ``ErrorCode`` when the frame names a reply topic
(``_wire.salvage_target`` reads it from frames that do not decode), else it
is dropped, counted and logged (``RateLimitedLog``: the first lines of each
window in full, then a count). Replies are built with ``Message.reply`` from the
request (``ReplyTarget.request``), with a ``shared.ReplyTiming``.

Requests come on each device's own topic, ``{prefix}/dev/{device}/infer/{model}``
(``topics.device_infer_filter``), which only that device may publish to (the
broker's ACL); the reply goes to that device's reply topic, derived from the
request topic: whatever reply address the request names is ignored, so one
device cannot have replies sent to another. With ``legacy_topics`` (off by
default; an opt-in for the migration from the first release, logged as a
warning while on) the hub also takes the first layout,
``{prefix}/infer/{model}``, answered where the request says (within
``reply_topic_allowed``): that is, redirectable. A retained request is never
acted on: it is a replay, not a device waiting. Nor is a request seen before
(same device and request id within a minute: ``RecentRequests``), nor one
that arrived later than its whole budget, judged from its ``sent_at_ms``
against its device's recent requests (``TransitBaseline``: a broker that was
frozen delivers its backlog at once); the latter is answered
``deadline_exceeded``. The subscriptions are shared (``$share/hubs/...``) so
requests spread over hub replicas and ingress processes, each delivered to
one; ``share_group=None`` subscribes plainly, for brokers without shared
subscriptions. The session subscribes again on every connection. On MQTT 5
a reply also carries a message expiry equal to the time left, and the
request's correlation data when it had some.

``on_reply`` (optional) hears of every reply just before it is published, on
the thread that publishes it, so metrics count a request by what its device
is told; an exception there is logged, never raised, and the reply still
goes out. ``tracer`` (optional, a ``HubTracer``: ``cloud_hub._tracing``) is
told of every answered request but probes, once its reply is out, with the
frame's W3C trace context (a bad one was dropped on decode; a frame that does
not decode has none), so its spans continue the device's trace.
``collector`` (optional, an ``ExampleCollector``) is shown each
request as it is decoded (``admit``) and, once its reply is sent, the
cloud's answer (``answered``): it keeps hard examples without a second
message and without I/O on the request's path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Protocol

from shared import (
    ErrorCode,
    InboundMessage,
    Limits,
    Message,
    MqttSession,
    ReplyTiming,
    RequestTopic,
    Topics,
    decode_message,
    encode_message,
)

from .._dispatch import Dispatcher, Outcome
from .._errors import (
    BadRequestError,
    BrokerError,
    DeadlineExceededError,
    HubError,
    InvalidRequestError,
    error_code,
)
from .._results import HubResult
from .._tracing import HubTracer, RequestTimes, TracedRequest
from ..collect._collector import ExampleCollector, Pending
from ._admission import RecentRequests, TransitBaseline
from ._log_limit import RateLimitedLog
from ._wire import ReplyTarget, reply_topic_allowed, salvage_target

__all__ = ["MqttFront", "ReplyObserver"]

log = logging.getLogger(__name__)

LEGACY_WARNING = (
    "legacy topics on: requests on %s are answered where the request says, so a device "
    "can redirect replies to another; turn them off once every device publishes on its own topic"
)
_TOPIC_CACHE = 10_000  # request topics remembered parsed (a few per device)


class ReplyObserver(Protocol):
    """Told of each reply: its request's model and version, receipt time, code and result."""

    def __call__(
        self,
        model: str,
        version: str | None,
        *,
        received: float,
        error: ErrorCode,
        result: HubResult | None,
    ) -> None: ...


class MqttFront:
    """Serves inference requests from an MQTT session through a dispatcher."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        session: MqttSession,
        *,
        topics: Topics | None = None,
        share_group: str | None = "hubs",
        limits: Limits | None = None,
        on_reply: ReplyObserver | None = None,
        legacy_topics: bool = False,
        collector: ExampleCollector | None = None,
        tracer: HubTracer | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.tracer = tracer
        self.session = session
        self.topics = topics or Topics()
        self.limits = limits or Limits()
        self.subscriptions = [self.topics.device_infer_filter(share_group)]
        if legacy_topics:
            self.subscriptions.append(self.topics.infer_filter(share_group))
            log.warning(LEGACY_WARNING, self.topics.infer_filter())
        self._on_reply = on_reply
        self._collector = collector
        self._paused = False
        # One Counter per counting thread (the session's, each replying thread), summed by
        # ``stats``: a shared lock here would be taken twice per request by two threads.
        self._local = threading.local()
        self._counters: list[Counter[str]] = []
        self._topic_cache: dict[str, RequestTopic] = {}  # parsed request topics, by topic
        self._drop_log = RateLimitedLog(log, "dropped frames")  # a device can send junk at will
        self._recent = RecentRequests()  # (device, request id) taken in the last minute
        self._transit = TransitBaseline()  # how late each device's requests arrive
        session.on_message = self._handle

    @property
    def subscribed(self) -> threading.Event:
        return self.session.subscribed

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, *, wait_s: float | None = 10.0) -> MqttFront:
        """Connect (in the background, retrying) and subscribe.

        With ``wait_s``, wait until the subscription is granted and raise
        ``BrokerError`` (after cleaning up) if it is not within that time.
        """
        for subscription in self.subscriptions:
            self.session.subscribe(subscription, qos=1)
        self.session.start()
        log.info(
            "hub %s connecting to %s, subscribing to %s",
            self.session.client_id,
            self.session.settings.url,
            " and ".join(self.subscriptions),
        )
        if wait_s is not None and not self.session.subscribed.wait(wait_s):
            failure = self.session.connect_failure
            self.session.stop(timeout_s=1.0)
            where = self.session.settings.url
            why = (
                failure.explain(where)
                if failure is not None and not self.session.connects
                else "broker down, credentials refused, or shared subscriptions unsupported?"
            )
            raise BrokerError(
                f"no subscription to {self.subscriptions} on {where} within {wait_s}s ({why})"
            )
        return self

    def pause(self) -> None:
        """Stop taking new requests (unsubscribe) while replies keep flowing."""
        self._paused = True
        for subscription in self.subscriptions:
            self.session.unsubscribe(subscription)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Unsubscribe, wait for the acks of the replies sent, then disconnect.

        Replies are published as requests finish, so stop the dispatcher's queues
        first (``Hub.stop`` does): they answer what they hold before this waits.
        """
        self.pause()
        self.session.stop(timeout_s)
        self._drop_log.flush()
        log.info("hub %s disconnected", self.session.client_id)

    def stats(self) -> dict[str, int]:
        """Counters: received, probes, replied_ok, replied_<error code>, dropped, publish_failed,
        duplicates (also dropped) and expired_in_transit (also replied_deadline_exceeded)."""
        total: Counter[str] = Counter()
        for counts in list(self._counters):
            total.update(dict(counts))
        return dict(total)

    def _count(self, what: str) -> None:
        counts: Counter[str] | None = getattr(self._local, "counts", None)
        if counts is None:
            counts = self._local.counts = Counter()
            self._counters.append(counts)
        counts[what] += 1

    # -- requests (the session's thread: decode, hand off, return) ------------------------

    def _handle(self, message: InboundMessage) -> None:
        received = time.monotonic()
        self._count("received")
        topic, payload = message.topic, message.payload
        if message.retain:  # a replay of an old request, not a device waiting: never act on it
            self._drop(f"retained request on {topic} ignored")
            return
        where = self._topic_cache.get(topic)
        if where is None:
            where = self.topics.parse_request_topic(topic)
            if len(self._topic_cache) >= _TOPIC_CACHE:  # devices come and go: start over
                self._topic_cache.clear()
            if where is not None:
                self._topic_cache[topic] = where
        if where is None:
            self._drop(f"message on {topic}, which is no request topic")
            return
        # A device's own topic fixes where the answer goes; the first layout trusts the frame.
        own_reply = None if where.device is None else self.topics.reply(where.device)
        try:
            request = decode_message(payload, self.limits)
        except Exception as e:  # ProtocolError family; anything else is still the frame's fault
            target = salvage_target(
                payload,
                limits=self.limits,
                topics=self.topics,
                topic_model=where.model,
                received=received,
                response_topic=message.response_topic,
                correlation_data=message.correlation_data,
                reply_to=own_reply,
            )
            self._reject(target, e, topic)
            return
        if request.kind != "request":
            self._drop(f"a {request.kind} on request topic {topic}")
            return
        reply_to = own_reply or request.reply_to or message.response_topic
        if not reply_topic_allowed(reply_to, self.topics):
            self._drop(f"request {request.request_id} on {topic}: no usable reply topic")
            return
        assert reply_to is not None
        target = ReplyTarget.of(request, reply_to, received, message.correlation_data)
        error: HubError | None = None
        if where.model != request.model:
            error = BadRequestError(
                f"header names model {request.model!r} but it came on topic {topic}"
            )
        elif where.device is not None and request.device_id not in (None, where.device):
            error = BadRequestError(
                f"header names device {request.device_id!r} but it came on {where.device}'s topic"
            )
        if error is not None:
            self._reject(target, error, topic)
            return
        tensors, request.tensors = request.tensors, {}  # the target keeps the header only
        if not tensors:
            self._answer_probe(target)
            return
        sender = where.device or request.device_id or reply_to
        if self._recent.seen((sender, request.request_id), received):  # computed once
            self._count("duplicates")
            self._drop(f"request {request.request_id} of {sender} again (already taken)")
            return
        sent_at_ms, budget_ms = request.sent_at_ms, request.timeout_ms
        if sent_at_ms is not None and budget_ms is not None:
            late_s = self._transit.lateness_s(sender, time.time() - sent_at_ms / 1000.0, received)
            if late_s * 1000.0 > budget_ms:  # held up longer than its budget: its device gave up
                self._count("expired_in_transit")
                late = DeadlineExceededError(
                    f"request arrived {1000 * late_s:.0f} ms later than {sender}'s recent ones, "
                    f"past its {budget_ms:.0f} ms budget; not computed"
                )
                self._reject(target, late, topic)
                return
        lesson = None if self._collector is None else self._collector.admit(request, tensors)
        submitted = None if self.tracer is None else time.monotonic()
        try:
            self.dispatcher.submit(
                request.model,
                request.model_version,
                tensors,
                deadline=target.deadline,
                arrival=received,
                done=lambda outcome: self._answer(target, outcome, lesson, submitted),
            )
        except Exception as e:  # HubError: typed; anything else: INTERNAL, the hub goes on
            self._reject(target, e, topic)

    def _answer_probe(self, target: ReplyTarget) -> None:
        """A request without tensors is a device asking whether its model is served.

        Answered as before (``unknown_model``, or ``invalid_input`` when served,
        since nothing can be computed), but counted as a probe, not as a
        failed request of the model: every device sends one per connect.
        """
        self._count("probes")
        try:
            info = self.dispatcher.describe(target.model, target.model_version)
            outcome: BaseException = InvalidRequestError(
                f"a request without tensors (a probe): {info.model}@{info.version} is served"
            )
        except Exception as e:  # HubError: unknown model, stopping
            outcome = e
        try:
            reply, frame = self._reply_for(target, outcome)
            self._publish(target, reply, frame)
        except Exception:
            log.exception("could not answer probe %s", target.request_id)

    def _reject(self, target: ReplyTarget | None, error: BaseException, topic: str) -> None:
        if target is None:
            self._drop(f"undecodable frame on {topic} with no reply topic: {error}")
        else:
            self._answer(target, error)

    def _drop(self, why: str) -> None:
        self._count("dropped")
        self._drop_log.warning("dropped %s", why)

    # -- replies --------------------------------------------------------------------------

    def _answer(
        self,
        target: ReplyTarget,
        outcome: Outcome,
        lesson: Pending | None = None,
        submitted: float | None = None,
    ) -> None:
        """Encode and publish the reply to one request; never raises (it runs in callbacks).

        ``submitted``: when it went to the dispatcher (monotonic), for its spans.
        """
        answered = time.monotonic() if self.tracer is not None else 0.0
        try:
            reply, frame = self._reply_for(target, outcome)
            self._observe(target, reply, outcome)
            self._publish(target, reply, frame)
            if self.tracer is not None:
                self._trace(target, reply, outcome, submitted, answered)
            if lesson is not None and reply.ok and isinstance(outcome, HubResult):
                assert self._collector is not None
                self._collector.answered(lesson, outcome)  # copies what it keeps: views die
        except Exception:
            log.exception(
                "could not reply to request %s", target.request_id, extra=_context(target)
            )

    def _reply_for(self, target: ReplyTarget, outcome: Outcome) -> tuple[Message, bytes]:
        if isinstance(outcome, HubResult):
            reply = target.request.reply(
                tensors=outcome.outputs,
                model_version=outcome.model_version,
                timing=ReplyTiming(
                    queue_ms=outcome.queue_ms,
                    compute_ms=outcome.compute_ms,
                    hub_ms=1000.0 * (time.monotonic() - target.received),
                ),
            )
            try:
                return reply, encode_message(reply)
            except Exception as e:  # an output the codec cannot carry
                outcome = HubError(f"cannot encode the model's outputs: {e}")
        code = error_code(outcome)
        if code is ErrorCode.INTERNAL:  # a model failure (HubError) is expected; a bug is not
            level = logging.WARNING if isinstance(outcome, HubError) else logging.ERROR
            log.log(
                level, "request %s failed: %r", target.request_id, outcome, extra=_context(target)
            )
        reply = target.request.reply(
            error=code,
            error_message=str(outcome) or type(outcome).__name__,
            timing=ReplyTiming(hub_ms=1000.0 * (time.monotonic() - target.received)),
        )
        return reply, encode_message(reply)

    def _observe(self, target: ReplyTarget, reply: Message, outcome: Outcome) -> None:
        if self._on_reply is None:
            return
        try:
            self._on_reply(
                target.model,
                target.model_version,
                received=target.received,
                error=reply.error,
                result=outcome if reply.ok and isinstance(outcome, HubResult) else None,
            )
        except Exception:
            log.exception(
                "on_reply failed for request %s", target.request_id, extra=_context(target)
            )

    def _trace(
        self,
        target: ReplyTarget,
        reply: Message,
        outcome: Outcome,
        submitted: float | None,
        answered: float,
    ) -> None:
        assert self.tracer is not None
        request = target.request
        self.tracer.record(
            TracedRequest(
                transport="mqtt",
                request_id=request.request_id,
                model=request.model,
                version=request.model_version,
                device=request.device_id,
                traceparent=request.traceparent,
                tracestate=request.tracestate,
            ),
            RequestTimes(
                received=target.received,
                submitted=submitted,
                answered=answered,
                sent=time.monotonic(),
            ),
            error=reply.error,
            result=outcome if reply.ok and isinstance(outcome, HubResult) else None,
        )

    def _publish(self, target: ReplyTarget, reply: Message, frame: bytes) -> None:
        handle = self.session.publish(
            target.reply_to,
            frame,
            qos=1,
            correlation_data=target.correlation_data,
            expiry_s=target.expiry_interval_s(time.monotonic()),
        )
        if handle.failed:
            self._count("publish_failed")
            log.warning("reply to %s not sent", target.request_id, extra=_context(target))
            return
        self._count("replied_" + reply.error.value)


def _context(target: ReplyTarget) -> dict[str, str | None]:
    """Log-record context (``extra=``) naming one request, for JSON logs."""
    return {
        "request_id": target.request_id,
        "device": target.device_id,
        "model": target.model,
        "model_version": target.model_version,
    }
