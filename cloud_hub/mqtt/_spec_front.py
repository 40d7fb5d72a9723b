"""The MQTT side of the hub for speculative decoding: rounds in, verdicts out.

``SpecFront`` shares the hub's MQTT session with the other fronts: it takes
the messages on verify topics (``shared._spec_wire``) and hands every other
one to the handler that was there before it. A session's first round comes
on ``{prefix}/dev/{device}/verify/{model}`` (shared subscription: one
replica takes it), its later rounds on ``…/verify/{model}/{hub}`` (this
replica alone, where the session's KV cache is; shared among this
replica's ingress processes only). The verdict goes to
``{prefix}/dev/{device}/verified``, derived from the request topic: a
request names no address, so no device can have verdicts sent to another,
and the session key includes the device, so none can reach another's
session. QoS 1 throughout.

Trust rules as for text turns: a retained round is never run; a round seen
before (same device and id within a minute) runs once; one that arrived
later than its whole budget is answered ``deadline_exceeded``; a frame
that does not decode is answered with a typed error verdict when its id
and session can be read, and dropped (counted, logged at a bounded rate)
when not; a header naming another device or model than its topic is
``bad_request``; an unknown model ``unknown_model``.

Each model gets its ``Verifier`` (``cloud_hub.language``) the first time a
round names it, over the served folder (``model_dir``: by default that of
an in-process ``LanguageEngine``; the process plane's ingress names the
repository's version folder, and loads the graph in its own process); a
model with no folder (vLLM) is answered ``unknown_model`` with the reason.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from shared import (
    ErrorCode,
    InboundMessage,
    Limits,
    MqttSession,
    RequestTopic,
    Topics,
    VerifyClose,
    VerifyFinish,
    VerifyMessage,
    VerifyRequest,
    VerifyResult,
    decode_verify_message,
    encode_verify_message,
    validate_name,
)

from .._errors import HubError, ModelNotFoundError, error_code
from ..language import (
    LanguageModels,
    ServedLanguageModel,
    SessionLimits,
    Verifier,
    VerifyModel,
)
from ._intake import RequestIntake

__all__ = ["SpecFront"]

log = logging.getLogger(__name__)


class SpecFront(RequestIntake[VerifyMessage]):
    """Serves verification rounds from an MQTT session (see the module docstring)."""

    def __init__(
        self,
        models: LanguageModels,
        session: MqttSession,
        *,
        topics: Topics | None = None,
        share_group: str | None = "hubs",
        limits: Limits | None = None,
        hub_id: str | None = None,
        session_limits: SessionLimits | None = None,
        model_dir: Callable[[ServedLanguageModel], Path | None] | None = None,
    ) -> None:
        self.models = models
        self.topics = topics or Topics()
        self.session_limits = session_limits or SessionLimits()
        self._model_dir = model_dir or _engine_directory
        self.hub_id = None if hub_id is None else validate_name(hub_id, "hub id")
        self.subscriptions = [self.topics.device_verify_filter(share_group)]
        if self.hub_id is not None:
            self.subscriptions.append(self.topics.hub_verify_filter(self.hub_id, share_group))
        super().__init__(session, limits, log, "dropped verify frames")
        self._verifiers: dict[tuple[str, str], Verifier] = {}

    def start(self) -> SpecFront:
        for subscription in self.subscriptions:
            self.session.subscribe(subscription, qos=1)
        return self

    def stop(self) -> None:
        """Take no more rounds; stop the verifiers (a device's rounds in flight time out and
        it finishes its turn alone)."""
        for subscription in self.subscriptions:
            self.session.unsubscribe(subscription)
        with self._lock:
            verifiers = list(self._verifiers.values())
            self._verifiers.clear()
        for verifier in verifiers:
            verifier.stop()
        self._drop_log.flush()

    def stats(self) -> dict[str, int]:
        """The front's counters (received, rounds, closes, duplicates, dropped, refused_<code>,
        verdicts, publish_failed) and, summed over the models, the verifiers'
        (``verify_forwards``, ``verify_rounds``, ``tokens_committed``, ...)."""
        with self._lock:
            out = Counter(self._counts)
            verifiers = list(self._verifiers.values())
        for verifier in verifiers:
            out.update(verifier.stats())
        return dict(out)

    def verifier(self, model: str) -> Verifier:
        """The model's verifier, made on first use (``ModelNotFoundError``)."""
        served = self.models.get(model)
        key = (served.name, served.version)
        with self._lock:
            verifier = self._verifiers.get(key)
        if verifier is not None:
            return verifier
        directory = self._model_dir(served)
        if directory is None:
            raise ModelNotFoundError(
                f"language model {model!r} is not served from an ONNX folder in this process; "
                "it cannot verify drafts"
            )
        made = Verifier(VerifyModel(directory), limits=self.session_limits, hub_id=self.hub_id)
        with self._lock:
            verifier = self._verifiers.setdefault(key, made)
        if verifier is not made:
            made.stop()
        return verifier

    # -- the session's thread -------------------------------------------------------------

    def _parse(self, topic: str) -> RequestTopic | None:
        return self.topics.parse_verify_topic(topic)

    def _decode(self, payload: bytes) -> VerifyMessage:
        return decode_verify_message(payload, self.limits)

    def _take_decoded(self, message: InboundMessage, where: RequestTopic, device: str,
                      decoded: VerifyMessage, received: float) -> None:  # fmt: skip
        if isinstance(decoded, VerifyResult):
            self._drop(f"a verdict on verify topic {message.topic}")
            return
        if decoded.device_id not in (None, device):
            if isinstance(decoded, VerifyRequest):
                self._refuse(device, decoded.request_id, decoded.session, decoded.round,
                             ErrorCode.BAD_REQUEST, f"the header names device "
                             f"{decoded.device_id}, the topic {device}")  # fmt: skip
            else:
                self._drop(f"a close naming {decoded.device_id} on {device}'s topic")
            return
        if self._recent.seen((device, decoded.request_id), received):
            self._count("duplicates")
            self._drop(f"round {decoded.request_id} of {device} again (already taken)")
            return
        if isinstance(decoded, VerifyClose):
            self._close(device, where.model, decoded)
            return
        self._take(device, where.model, decoded, received)

    def _take(self, device: str, model: str, request: VerifyRequest, received: float) -> None:
        if request.model != model:
            self._refuse(device, request.request_id, request.session, request.round,
                         ErrorCode.BAD_REQUEST, f"the header names model {request.model}, "
                         f"the topic {model}")  # fmt: skip
            return
        budget = request.timeout_ms
        late_s = self._late_s(device, request.sent_at_ms, budget, received)
        if late_s is not None:
            self._refuse(device, request.request_id, request.session, request.round,
                         ErrorCode.DEADLINE_EXCEEDED, f"the round arrived "
                         f"{1000 * late_s:.0f} ms late, past its budget; not run")  # fmt: skip
            return
        deadline = None if budget is None else received + budget / 1000.0
        try:
            verifier = self.verifier(model)
            topic = self.topics.verified(device)
            verifier.submit(device, request, lambda r: self._publish(topic, r), deadline)
        except Exception as e:  # HubError: typed; anything else: INTERNAL
            if not isinstance(e, HubError):
                log.exception("round %s of %s failed", request.request_id, device)
            self._refuse(device, request.request_id, request.session, request.round,
                         error_code(e), str(e) or type(e).__name__)  # fmt: skip
            return
        self._count("rounds")

    def _close(self, device: str, model: str, close: VerifyClose) -> None:
        self._count("closes")
        try:
            self.verifier(model).close_session(device, close)
        except Exception as e:  # an unknown model or a stopping verifier: nothing to free
            self._drop(f"close of {close.session} of {device}: {e}")

    def _refuse_undecodable(self, message: InboundMessage, device: str, error: Exception) -> None:
        header = self._readable_header(message)
        request_id, session, rnd = header.get("id"), header.get("session"), header.get("round")
        if not (
            header.get("kind") == "verify"
            and all(_printable_id(v) for v in (request_id, session))
            and isinstance(rnd, int)
            and 0 <= rnd < 2**31
        ):
            self._drop(f"undecodable frame on {message.topic} with no round to answer: {error}")
            return
        assert isinstance(request_id, str) and isinstance(session, str)
        self._refuse(device, request_id, session, rnd, error_code(error), str(error))

    def _refuse(self, device: str, request_id: str, session: str, rnd: int, code: ErrorCode,
                message: str) -> None:  # fmt: skip
        self._count(f"refused_{code.value}")
        result = VerifyResult(
            request_id=request_id, session=session, round=rnd, finish=VerifyFinish.ERROR,
            error=code, error_message=message or code.value, hub=self.hub_id,
        )  # fmt: skip
        self._publish(self.topics.verified(device), result)

    def _publish(self, topic: str, result: VerifyResult) -> None:
        handle = self.session.publish(topic, encode_verify_message(result), qos=1)
        self._count("publish_failed" if handle.failed else "verdicts")


def _engine_directory(served: ServedLanguageModel) -> Path | None:
    """The folder an in-process ONNX Runtime GenAI engine serves (None for other engines)."""
    directory = getattr(served.engine, "directory", None)
    if getattr(served.engine, "platform", None) != "onnxruntime_genai":
        return None
    return None if directory is None else Path(directory)


def _printable_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 128 and value.isprintable()
