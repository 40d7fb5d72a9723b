"""An ingress process's connections to every executor of its hub, by model.

``submit`` checks a request against the model's inputs (so a bad request
never reaches an executor), picks the instance with the fewest requests in
flight, writes the request into that connection's ring and remembers whom to tell;
the reply, read by ``on_readable`` (or ``poll``), goes to that callback,
exactly once (its arrays are views into the ring, valid during the callback,
unless ``copy_replies``). What can go wrong is raised by ``submit`` at once, as the
``HubError`` a device receives: ``ModelNotFoundError`` (no such model or
version), ``InvalidRequestError`` (inputs the model cannot take),
``OverloadedError`` (the ring is full: too many bytes in flight; or no
executor of the model is connected, e.g. while one restarts).

Which executors serve which model comes from ``ServedVersions`` (model -> the version
served and its instances' addresses), given at start and again by ``update``
when the hub swaps a version in: the new version's connections connect first, new
requests go to it once one of its instances is connected, and the old
version's connections close once their requests in flight are answered, so a swap
drops nothing.

When a connection closes (its executor crashed or stopped), every request still
in flight on it is answered ``IpcClosedError`` (an ``overloaded`` reply: the
device falls back at once, and nothing is answered with another request's
outputs); ``connect_missing`` connects again once the executor is back.

Threads: ``submit`` may run on one thread and ``on_readable``/``poll`` on
another (the MQTT ingress does this); the in-flight table is a dict, whose
single operations the GIL keeps whole, and each entry is added before its
request is written, so a reply never arrives before its entry.
"""

from __future__ import annotations

import itertools
import logging
import selectors
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from .._errors import HubError, ModelNotFoundError, OverloadedError, RequestTooLargeError
from .._model_info import ModelInfo
from ..batching._queue import InputChecker
from ._ipc import DEFAULT_RING_BYTES, ExecutorConnection, IpcClosedError
from ._records import ReplyRecord

__all__ = ["ExecutorPool", "ReplyCallback", "ServedVersion", "ServedVersions"]

log = logging.getLogger(__name__)

ReplyCallback = Callable[[ModelInfo, "ReplyRecord | HubError"], None]
_RETRY_S = 0.5


@dataclass(frozen=True)
class ServedVersion:
    """The version of a model that is served, and where each of its instances listens."""

    version: str
    addresses: tuple[str, ...]


ServedVersions = Mapping[str, ServedVersion]


@dataclass(eq=False)
class _Instance:
    address: str
    model: str
    connection: ExecutorConnection
    inflight: int = 0
    next_try: float = 0.0


@dataclass(eq=False)
class _Group:
    """One version's instances of a model."""

    served: ServedVersion
    instances: list[_Instance]

    def connected(self) -> list[_Instance]:
        return [i for i in self.instances if i.connection.connected]


class ExecutorPool:
    """Connections to the executors of each model's served version (see the module docstring)."""

    def __init__(
        self,
        served: ServedVersions,
        *,
        ingress_id: str,
        ring_bytes: int = DEFAULT_RING_BYTES,
        copy_replies: bool = False,
    ) -> None:
        self.ingress_id = ingress_id
        self._ring_bytes = ring_bytes
        self._copy_replies = copy_replies
        self._active: dict[str, _Group] = {}  # what new requests go to
        self._coming: dict[str, _Group] = {}  # a new version, until one instance connects
        self._leaving: list[_Group] = []  # old versions, until their requests are answered
        self._by_connection: dict[ExecutorConnection, _Instance] = {}
        # Told before a connection is closed here, so whoever watches its descriptor lets go first.
        self.on_connection_closing: Callable[[ExecutorConnection], None] | None = None
        for model, wanted in served.items():
            self._active[model] = self._group(model, wanted)
        self._inflight: dict[int, tuple[_Instance, ModelInfo, ReplyCallback]] = {}
        self._keys = itertools.count(1)
        self._checkers: dict[tuple[str, str], InputChecker] = {}
        self._selector = selectors.DefaultSelector()
        self._registered: set[ExecutorConnection] = set()
        self._lock = threading.Lock()  # connect/close against submit's choice of a connection

    # -- what is served -------------------------------------------------------------------

    def _group(self, model: str, wanted: ServedVersion) -> _Group:
        group = _Group(wanted, [])
        for address in wanted.addresses:
            conn = ExecutorConnection(
                address,
                ingress_id=self.ingress_id,
                on_reply=self._on_reply,
                ring_bytes=self._ring_bytes,
                copy_replies=self._copy_replies,
            )
            instance = _Instance(address, model, conn)
            group.instances.append(instance)
            self._by_connection[conn] = instance
        return group

    def update(self, served: ServedVersions) -> None:
        """Serve ``served`` from now on: new versions come in, old ones leave when done."""
        for model, wanted in served.items():
            current = self._coming.get(model) or self._active.get(model)
            if current is not None and current.served == wanted:
                continue
            if model not in self._active:  # a new model: nothing to keep serving meanwhile
                self._active[model] = self._group(model, wanted)
                continue
            stale = self._coming.pop(model, None)
            if stale is not None:
                self._leaving.append(stale)
            self._coming[model] = self._group(model, wanted)
            log.info("model %s: version %s coming in", model, wanted.version)
        for model in [m for m in self._active if m not in served]:
            self._leaving.append(self._active.pop(model))
            log.info("model %s: no longer served", model)

    def _settle(self) -> None:
        """Promote connected new versions; close old ones that have nothing in flight."""
        for model, group in list(self._coming.items()):
            if group.connected():
                old = self._active.get(model)
                self._active[model] = group
                del self._coming[model]
                if old is not None:
                    self._leaving.append(old)
                log.info("model %s: version %s serves", model, group.served.version)
        for group in list(self._leaving):
            if all(i.inflight == 0 for i in group.instances):
                self._leaving.remove(group)
                for instance in group.instances:
                    self._closing(instance.connection)
                    instance.connection.close()
                    self._by_connection.pop(instance.connection, None)

    @property
    def model_names(self) -> list[str]:
        return sorted(self._active)

    def info(self, model: str, version: str | None = None) -> ModelInfo:
        """The served description of ``model`` (from a connected instance)."""
        group = self._active.get(model)
        if group is None:
            known = ", ".join(sorted(self._active)) or "none"
            raise ModelNotFoundError(f"no model {model!r} is served here (models: {known})")
        for instance in group.instances:
            info = instance.connection.info
            if info is not None and instance.connection.connected:
                if version is not None and version != info.version:
                    raise ModelNotFoundError(
                        f"model {model!r} version {version!r} is not served here "
                        f"(serving version {info.version})"
                    )
                return info
        raise OverloadedError(f"model {model!r} is starting or restarting; try again shortly")

    def ready(self) -> bool:
        """Whether every model has at least one connected executor."""
        return all(g.connected() for g in self._active.values())

    # -- requests -------------------------------------------------------------------------

    def submit(
        self,
        model: str,
        version: str | None,
        inputs: Mapping[str, np.ndarray],
        *,
        deadline: float | None,
        arrival: float,
        done: ReplyCallback,
    ) -> None:
        """Send one request; ``done(info, reply or error)`` is called once, later.

        Raises ``HubError`` instead of calling ``done`` when it is refused at once.
        """
        info = self.info(model, version)
        _, rows, _ = self._checker(info)(inputs)
        tensors = [(i, inputs[spec.name]) for i, spec in enumerate(info.inputs)]
        instance = self._pick(model)
        key = next(self._keys)
        self._inflight[key] = (instance, info, done)
        instance.inflight += 1
        try:
            accepted = instance.connection.submit(key, deadline, arrival, rows, tensors)
        except IpcClosedError as e:
            self._forget(key)
            raise OverloadedError(f"model {model!r}: {e}") from e
        except ValueError as e:
            self._forget(key)
            raise RequestTooLargeError(f"request too large for the hub's buffers: {e}") from e
        if not accepted:
            self._forget(key)
            raise OverloadedError(
                f"model {model!r}: too many bytes in flight in this hub; try again later"
            )

    def _checker(self, info: ModelInfo) -> InputChecker:
        """The input checker of the model as served now (a new version gets a new one)."""
        checker = self._checkers.get((info.model, info.version))
        if checker is None or checker.specs != info.inputs:
            checker = InputChecker(
                info.inputs,
                max_batch_size=info.max_batch_size,
                model=info.model,
                allow_non_finite=bool(info.extra.get("allow_non_finite", False)),
            )
            self._checkers[(info.model, info.version)] = checker
        return checker

    def _pick(self, model: str) -> _Instance:
        connected = self._active[model].connected()
        if not connected:
            raise OverloadedError(f"model {model!r} is restarting; try again shortly")
        return min(connected, key=lambda i: i.inflight)

    def _forget(self, key: int) -> None:
        entry = self._inflight.pop(key, None)
        if entry is not None:
            entry[0].inflight -= 1

    def _on_reply(self, record: ReplyRecord) -> None:
        entry = self._inflight.pop(record.key, None)
        if entry is None:
            log.warning("reply for unknown request key %d dropped", record.key)
            return
        instance, info, done = entry
        instance.inflight -= 1
        try:
            done(info, record)
        except Exception:  # a callback's bug must not stop the replies behind it
            log.exception("reply callback failed")

    # -- connections ----------------------------------------------------------------------

    def connect_missing(self, *, timeout_s: float = 2.0) -> int:
        """Connect each executor whose connection is down and due a try; returns how many are up.

        Executors of versions on their way out are not connected again.
        """
        now = time.monotonic()
        leaving = {i.connection for g in self._leaving for i in g.instances}
        for instance in list(self._by_connection.values()):
            conn = instance.connection
            if conn.connected or now < instance.next_try or conn in leaving:
                continue
            try:
                conn.connect(timeout_s)
            except OSError as e:
                instance.next_try = now + _RETRY_S
                log.debug("executor %s not reachable yet: %s", instance.address[1:], e)
                continue
            log.info("connected to executor %s (%s)", instance.address[1:], conn.info)
        self._settle()
        return sum(1 for i in self._by_connection.values() if i.connection.connected)

    def connections(self) -> list[ExecutorConnection]:
        return [i.connection for i in self._by_connection.values() if i.connection.connected]

    def on_readable(self, conn: ExecutorConnection) -> None:
        """Read ``conn``'s replies; on a closed connection, fail what it held and close it."""
        try:
            conn.on_readable()
        except IpcClosedError as e:
            self.close_connection(conn, str(e))

    def close_connection(self, conn: ExecutorConnection, why: str) -> None:
        instance = self._by_connection.get(conn)
        if instance is None:  # closed already, with its version
            return
        self._closing(conn)
        conn.close()
        instance.next_try = time.monotonic()
        lost = [k for k, entry in list(self._inflight.items()) if entry[0] is instance]
        if lost:
            log.warning(
                "executor %s went away (%s): answering %d request(s) in flight with an error",
                instance.address[1:],
                why,
                len(lost),
            )
        for key in lost:
            entry = self._inflight.pop(key, None)
            if entry is None:
                continue
            instance.inflight -= 1
            _, info, done = entry
            try:
                done(info, IpcClosedError(f"the executor of {info.model} restarted"))
            except Exception:
                log.exception("reply callback failed")

    def _closing(self, conn: ExecutorConnection) -> None:
        if self.on_connection_closing is not None and conn.connected:
            try:
                self.on_connection_closing(conn)
            except Exception:
                log.exception("on_connection_closing failed")

    def poll(self, timeout_s: float) -> None:
        """One round for a thread that owns the pool's reading: reconnect, wait, read."""
        self.connect_missing()
        current = set(self.connections())
        for conn in self._registered - current:
            self._selector.unregister(conn)
        for conn in current - self._registered:
            self._selector.register(conn, selectors.EVENT_READ)
        self._registered = current
        for conn in current:
            if conn.wants_write:
                conn.flush()
        if not current:
            time.sleep(min(timeout_s, _RETRY_S))
            return
        for key, _ in self._selector.select(timeout_s):
            ready = key.fileobj
            assert isinstance(ready, ExecutorConnection)
            self.on_readable(ready)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def close(self) -> None:
        for conn in list(self._by_connection):
            if conn.connected:
                self.close_connection(conn, "the ingress is stopping")
            else:
                conn.close()
        self._selector.close()
