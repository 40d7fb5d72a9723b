"""The MQTT side of the hub for text: generate requests in, chunks and a final out.

``TextFront`` shares the hub's MQTT session with the tensor ``MqttFront``:
it takes the messages on text topics (``shared._text_wire``) and hands
every other one to the handler that was there before it. A device's turn
comes on ``{prefix}/dev/{device}/generate/{model}`` (shared subscription:
one replica takes it) and runs on that model's ``LanguageEngine``
(``hub.language``); its cancels come on ``{prefix}/dev/{device}/cancel``,
which every replica hears (not shared), and free the engine slot at once.
The chunks and the final go to ``{prefix}/dev/{device}/text``, derived from
the request topic: a request names no address, so one device cannot have
text sent to another. QoS 1 throughout.

The same trust rules as for tensors, with the same helpers: a retained
request is never run (a replay, not a device waiting); a request seen
before (same device and id within a minute: ``RecentRequests``) runs once;
one that arrived later than its whole budget (``TransitBaseline``) is
answered ``deadline_exceeded`` without running; a frame that does not
decode is answered with a typed error final when its id can be read
(``too_large`` over a limit, ``bad_request`` otherwise) and dropped,
counted and logged at a bounded rate (``RateLimitedLog``) when not.
A request's own errors (unknown model, a prompt over the model's limits or
out of its vocabulary, a full queue) are error finals with their
``ErrorCode``.

Chunks are coalesced (``ChunkCoalescer``): the engine's updates arrive on
its thread, a chunk goes out at once when the link was quiet for
``max_delay_s``, else when that much time has passed (this front's timer
thread) or enough text is pending; each has the next ``seq``, and the final
follows the last chunk. A turn still running when its request's budget
(``timeout_ms``) is spent is cancelled and ends ``deadline``. ``stop``
answers every turn still running with an ``overloaded`` final (the device
finishes it elsewhere at once) and cancels it in the engine. A request that
names a conversation continues the engine's kept conversation of that id for
that device (``_conversation``: a device can never reach another's), where
the prompt repeats its history. Which replica holds it: every chunk and
final names this front's ``hub_id``, and the front also takes the turns
sent to that replica alone (``{prefix}/dev/{device}/generate/{model}/{hub}``,
shared among this replica's ingress processes only), which a device uses
for a conversation's next turn; such a turn is handled exactly as a shared
one (same trust rules, device from the topic, reply topic derived).
``share`` is not acted on (nothing collects text yet).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Any

from shared import (
    ErrorCode,
    GenerateCancel,
    GenerateChunk,
    GenerateFinal,
    GenerateFinish,
    GenerateRequest,
    InboundMessage,
    Limits,
    MqttSession,
    RequestTopic,
    TextMessage,
    Topics,
    decode_text_message,
    encode_text_message,
    validate_name,
)

from .._errors import DeadlineExceededError, HubError, error_code
from ..language import LanguageModels, Sampling, Turn, TurnUpdate
from ._coalesce import ChunkCoalescer, Coalescing
from ._intake import RequestIntake

__all__ = ["TextFront"]

log = logging.getLogger(__name__)

_FINISH = {
    "stop": GenerateFinish.STOP,
    "length": GenerateFinish.LENGTH,
    "cancelled": GenerateFinish.CANCELLED,
    "error": GenerateFinish.ERROR,
}


class _Stream:
    """One turn's way back to its device: sequence numbers, pending text, its end."""

    def __init__(self, front: TextFront, key: tuple[str, str], request: GenerateRequest,
                 deadline: float | None, version: str) -> None:  # fmt: skip
        self.front, self.key, self.request = front, key, request
        self.topic = front.topics.text(key[0])
        self.deadline = deadline
        self.version = version
        self.lock = threading.Lock()
        self.coalescer = ChunkCoalescer(front.coalescing)
        self.seq = 0
        self.ids_seen = 0
        self.done = False
        self.cut: GenerateFinish | None = None  # why the front cancelled it (deadline)
        self.flush_at: float | None = None  # the timer set for the pending text, if any
        self.turn: Turn | None = None

    def on_update(self, update: TurnUpdate) -> None:  # the engine's thread
        now = time.monotonic()
        with self.lock:
            if self.done:
                return
            new_ids = update.tokens[self.ids_seen :]
            self.ids_seen = len(update.tokens)
            ready = self.coalescer.add(update.text, new_ids, now)
            if update.finish is None:
                if ready:
                    self._flush(now)
                else:
                    due = self.coalescer.due_at()
                    if due is not None and self.flush_at != due:  # one timer per chunk
                        self.flush_at = due
                        self.front._schedule(due, self)
                return
            self._flush(now)
            finish = self.cut or _FINISH.get(update.finish, GenerateFinish.STOP)
            code = ErrorCode.OK
            if finish is GenerateFinish.ERROR:
                code = update.code or ErrorCode.INTERNAL
            self._end(
                GenerateFinal(
                    request_id=self.request.request_id,
                    seq=self.seq,
                    finish=finish,
                    prompt_tokens=update.prompt_tokens,
                    completion_tokens=update.completion_tokens,
                    cached_tokens=update.cached_prompt_tokens,
                    error=code,
                    error_message=update.error or "",
                    model_version=self.version,
                    hub=self.front.hub_id,
                )
            )

    def flush_due(self, now: float) -> None:  # the timer thread
        with self.lock:
            due = self.coalescer.due_at()
            if not self.done and due is not None and now >= due:
                self._flush(now)

    def fail(self, code: ErrorCode, message: str) -> None:
        """End the turn now with an error final (the hub stopping)."""
        with self.lock:
            if self.done:
                return
            self._flush(time.monotonic())
            self._end(
                GenerateFinal(
                    request_id=self.request.request_id,
                    seq=self.seq,
                    finish=GenerateFinish.ERROR,
                    error=code,
                    error_message=message,
                    model_version=self.version,
                    hub=self.front.hub_id,
                )
            )

    def _flush(self, now: float) -> None:
        if not self.coalescer.pending:
            return
        text, ids = self.coalescer.take(now)
        chunk = GenerateChunk(
            request_id=self.request.request_id, seq=self.seq, text=text, token_ids=ids,
            hub=self.front.hub_id,
        )  # fmt: skip
        self.seq += 1
        self.front._publish(self.topic, encode_text_message(chunk), "chunks")

    def _end(self, final: GenerateFinal) -> None:
        self.done = True
        self.front._publish(self.topic, encode_text_message(final), "final_" + final.finish)
        self.front._forget(self.key)


class TextFront(RequestIntake[TextMessage]):
    """Serves text-generation turns from an MQTT session through ``LanguageModels``."""

    def __init__(
        self,
        models: LanguageModels,
        session: MqttSession,
        *,
        topics: Topics | None = None,
        share_group: str | None = "hubs",
        limits: Limits | None = None,
        coalescing: Coalescing | None = None,
        hub_id: str | None = None,
    ) -> None:
        self.models = models
        self.topics = topics or Topics()
        self.coalescing = coalescing or Coalescing()
        self.hub_id = None if hub_id is None else validate_name(hub_id, "hub id")
        self.subscriptions = [
            self.topics.device_generate_filter(share_group),
            self.topics.cancel_filter(),
        ]
        if self.hub_id is not None:  # turns for this replica alone (sticky conversations)
            self.subscriptions.append(self.topics.hub_generate_filter(self.hub_id, share_group))
        super().__init__(session, limits, log, "dropped text frames")
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._timer = threading.Condition()
        self._timers: list[tuple[float, int, str, _Stream]] = []
        self._order = itertools.count()
        self._stopping = False
        self._thread = threading.Thread(target=self._run_timers, name="text-timers", daemon=True)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> TextFront:
        """Subscribe (the session sends it on every connection) and start the timer."""
        for subscription in self.subscriptions:
            self.session.subscribe(subscription, qos=1)
        if not self._thread.is_alive():
            self._thread.start()
        return self

    def pause(self) -> None:
        """Take no new turns; those running keep streaming."""
        for subscription in self.subscriptions:
            self.session.unsubscribe(subscription)

    def stop(self) -> None:
        """Answer every running turn ``overloaded`` (its device goes elsewhere) and cancel it.

        Call before the session stops, so the finals go out with it.
        """
        self.pause()
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.fail(ErrorCode.OVERLOADED, "the hub is stopping; finish the turn elsewhere")
            if stream.turn is not None:
                stream.turn.cancel()
        with self._timer:
            self._stopping = True
            self._timer.notify()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self._drop_log.flush()

    def stats(self) -> dict[str, int]:
        """Counters: received, turns, sticky (turns sent to this replica alone), cancels,
        duplicates, dropped, chunks, final_<finish>, refused_<code>, expired_in_transit,
        publish_failed; and ``streaming`` now."""
        with self._lock:
            return {**self._counts, "streaming": len(self._streams)}

    # -- the session's thread -------------------------------------------------------------

    def _parse(self, topic: str) -> RequestTopic | None:
        return self.topics.parse_text_topic(topic)

    def _decode(self, payload: bytes) -> TextMessage:
        return decode_text_message(payload, self.limits)

    def _take_decoded(self, message: InboundMessage, where: RequestTopic, device: str,
                      decoded: TextMessage, received: float) -> None:  # fmt: skip
        if where.model == "":  # a cancel topic
            if not isinstance(decoded, GenerateCancel):
                self._drop(f"a {type(decoded).__name__} on cancel topic {message.topic}")
                return
            self._cancel(device, decoded)
            return
        if not isinstance(decoded, GenerateRequest):
            self._drop(f"a {type(decoded).__name__} on generate topic {message.topic}")
            return
        if where.hub is not None:
            self._count("sticky")
        self._take(device, where.model, decoded, received)

    def _take(self, device: str, model: str, request: GenerateRequest, received: float) -> None:
        key = (device, request.request_id)
        if self._recent.seen(key, received):
            self._count("duplicates")
            self._drop(f"turn {request.request_id} of {device} again (already taken)")
            return
        if request.model != model or request.device_id not in (None, device):
            self._refuse(device, request.request_id, ErrorCode.BAD_REQUEST,
                         f"the header names {request.device_id}/{request.model}, the topic "
                         f"{device}/{model}")  # fmt: skip
            return
        budget = request.timeout_ms
        late_s = self._late_s(device, request.sent_at_ms, budget, received)
        if late_s is not None:
            assert budget is not None
            late = DeadlineExceededError(
                f"the turn arrived {1000 * late_s:.0f} ms late, past its {budget:.0f} ms "
                "budget; not run"
            )
            self._refuse(device, request.request_id, late.code, str(late))
            return
        deadline = None if budget is None else received + budget / 1000.0
        try:
            served = self.models.get(model)
            engine = served.engine
            ids: Any = request.prompt_ids
            if ids is None:
                assert request.prompt is not None
                ids = engine.encode(request.prompt)
            stream = _Stream(self, key, request, deadline, served.version)
            with self._lock:
                self._streams[key] = stream
            try:
                with stream.lock:  # no update is handled before the turn is known
                    stream.turn = engine.submit(
                        ids, max_tokens=request.max_tokens, sink=stream.on_update,
                        sampling=_engine_sampling(request),
                        conversation=_conversation(device, request),
                    )  # fmt: skip
            except BaseException:
                self._forget(key)
                raise
        except Exception as e:  # HubError: typed; anything else: INTERNAL
            if not isinstance(e, HubError):
                log.exception("turn %s of %s failed", request.request_id, device)
            self._refuse(device, request.request_id, error_code(e), str(e) or type(e).__name__)
            return
        self._count("turns")
        if deadline is not None:
            self._schedule(deadline, stream, "deadline")

    def _cancel(self, device: str, cancel: GenerateCancel) -> None:
        with self._lock:
            stream = self._streams.get((device, cancel.request_id))
        if stream is None:  # another replica's turn, or one that ended
            return
        self._count("cancels")
        if stream.turn is not None:
            stream.turn.cancel()

    def _refuse_undecodable(self, message: InboundMessage, device: str, error: Exception) -> None:
        header = self._readable_header(message)
        request_id = header.get("id")
        if not (
            isinstance(request_id, str)
            and 0 < len(request_id) <= 128
            and request_id.isprintable()
            and header.get("kind") == "generate"
        ):
            self._drop(f"undecodable frame on {message.topic} with no turn to answer: {error}")
            return
        self._refuse(device, request_id, error_code(error), str(error))

    def _refuse(self, device: str, request_id: str, code: ErrorCode, message: str) -> None:
        self._count(f"refused_{code.value}")
        final = GenerateFinal(
            request_id=request_id, seq=0, finish=GenerateFinish.ERROR, error=code,
            error_message=message or code.value, hub=self.hub_id,
        )  # fmt: skip
        self._publish(self.topics.text(device), encode_text_message(final), "final_error")

    # -- any thread -----------------------------------------------------------------------

    def _publish(self, topic: str, frame: bytes, what: str) -> None:
        handle = self.session.publish(topic, frame, qos=1)
        self._count("publish_failed" if handle.failed else what)

    def _forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._streams.pop(key, None)

    def _schedule(self, when: float, stream: _Stream, what: str = "flush") -> None:
        with self._timer:
            heapq.heappush(self._timers, (when, next(self._order), what, stream))
            self._timer.notify()

    def _run_timers(self) -> None:
        while True:
            with self._timer:
                while not self._stopping and (
                    not self._timers or self._timers[0][0] > time.monotonic()
                ):
                    wait = self._timers[0][0] - time.monotonic() if self._timers else None
                    self._timer.wait(wait)
                if self._stopping:
                    return
                _, _, what, stream = heapq.heappop(self._timers)
            if what == "flush":
                stream.flush_due(time.monotonic())
            elif not stream.done and stream.turn is not None:  # its budget is spent
                stream.cut = GenerateFinish.DEADLINE
                stream.turn.cancel()


def _engine_sampling(request: GenerateRequest) -> Sampling:
    """The engine's options: greedy, or temperature and top-p (top-k and the seed are not
    applied by the engine's default configuration; see docs/language-models.md)."""
    s = request.sampling
    if s.greedy:
        return Sampling()
    return Sampling(temperature=float(s.temperature or 0.0), top_p=float(s.top_p or 1.0),
                    seed=s.seed)  # fmt: skip


def _conversation(device: str, request: GenerateRequest) -> str | None:
    """The engine's id of the turn's kept conversation: the device's own, never another's.

    A newline can be in neither a device name nor a conversation id (printable
    characters), nor in the HTTP routes' ids (a header value), so no two meet.
    """
    if request.conversation is None:
        return None
    return f"mqtt\n{device}\n{request.conversation}"
