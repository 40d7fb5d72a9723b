"""Asking the hub, without waiting, whether it is there and serves the agent's cloud model.

A probe is a request for ``cloud_model`` that carries no tensors. A hub that
does not serve the model answers ``unknown_model``; one that does cannot
compute without inputs and answers ``invalid_input``. Either reply also
proves that the hub is up and reachable. The agent sends a probe after every
(re)connect of its uplink, and, while its breaker is open because the cloud
went silent, at most one every ``interval_s`` as calls come in (after a
broker restart the device may reconnect before the hub does, and the probe
it sent on connect found nobody). It never waits for one; what comes back:

* ``unknown_model``: one error line naming the model and where its name came
  from (a forgotten ``cloud_model`` defaults to the edge model's name; a
  mistyped one would otherwise turn every offload into
  ``fallback:unknown_model`` without a word); ``served`` becomes False;
* any other reply: ``served`` becomes True and the breaker hears that the
  hub is back (``CircuitBreaker.probe_now``), so offloading resumes at once
  instead of after its cool-down;
* no reply: nothing (the hub may be down; the breaker deals with that).

Cost to the hub: one small frame and one error reply per device connect,
and per device at most one per ``interval_s`` while it is unreachable (so
none reach it); the hub counts probes apart from its requests (not as failures).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from concurrent.futures import Future

from shared import ErrorCode, Message

from ._breaker import CircuitBreaker
from ._errors import UplinkError
from ._uplink import MqttUplink

__all__ = ["CloudProbe"]

log = logging.getLogger("tandem.edge")

_PROBE_TIMEOUT_MS = 5000.0


class CloudProbe:
    """Sends probes for one agent's cloud model and acts on the replies."""

    def __init__(
        self,
        uplink: MqttUplink,
        breaker: CircuitBreaker,
        *,
        model: str,
        version: str | None,
        id_prefix: str,
        defaulted: bool,
        interval_s: float = 0.5,
    ) -> None:
        self.uplink = uplink
        self.breaker = breaker
        self.model = model
        self.version = version
        self.defaulted = defaulted  # cloud_model was not given: the edge model's name
        self.served: bool | None = None  # None until a hub has answered a probe
        self.answered = threading.Event()
        self._id_prefix = id_prefix
        self._ids = itertools.count(1)
        self._last_id: str | None = None
        self._last_sent = -float("inf")
        self._warned = False
        self.interval_s = interval_s

    def on_breaker_open(self) -> None:
        """A call found the breaker open: probe if the cloud went silent, once per interval."""
        now = time.monotonic()
        if now - self._last_sent < self.interval_s or not self.breaker.awaiting_silence:
            return
        self._last_sent = now  # racing callers may both send: harmless, and no lock to take
        self.send()

    def send(self) -> None:
        """Publish one probe if connected (the reply is handled when it comes)."""
        if self._last_id is not None:  # a probe nobody answered must not pend forever
            self.uplink.forget(self._last_id)
        self._last_sent = time.monotonic()
        request_id = f"{self._id_prefix}-probe-{next(self._ids)}"
        self._last_id = request_id
        try:
            future, _ = self.uplink.send(
                model=self.model,
                tensors={},
                timeout_ms=_PROBE_TIMEOUT_MS,
                request_id=request_id,
                model_version=self.version,
            )
        except UplinkError:
            return  # not connected (any more): the next connect sends another
        future.add_done_callback(self._answered)

    def _answered(self, future: Future[Message]) -> None:
        if future.exception() is not None:
            return  # the connection went before the reply came
        reply = future.result()
        if reply.error is ErrorCode.UNKNOWN_MODEL:
            self.served = False
            if not self._warned:
                self._warned = True
                where = (
                    "cloud_model was not given, so the agent used the edge model's name"
                    if self.defaulted
                    else "as cloud_model= says"
                )
                log.error(
                    "the hub does not serve model %r (%s): every offload will fall back to "
                    "the local answer (fallback:unknown_model); pass cloud_model= a model the "
                    "hub serves (hub: %s)",
                    self.model,
                    where,
                    reply.error_message or "unknown model",
                )
        else:
            self.served = True
            self.breaker.probe_now()
        self.answered.set()
