"""Explicit model control: Triton's repository ``load`` and ``unload`` on a process-plane hub.

An HTTP ingress process is asked (``POST /v2/repository/models/{m}/load|unload``);
the supervisor, which owns the executors, does it. They talk through one folder
of the hub's run directory (``PlaneSpec.control_dir``), one pair of files per
model, each written whole (a temporary file, then a rename)::

    {model}.request.json   {"id": "…", "action": "load" | "unload", "version": "3" | null}
    {model}.answer.json    {"id": "…", "action": "load" | "unload", "ok": true | false,
                            "state": "READY" | "UNAVAILABLE", "version": "3" | null,
                            "reason": "…"}

The last request for a model wins, as with Triton. ``ModelControl`` is the
supervisor's side and its memory: the models unloaded (left out of what the
repository would serve) and the versions a load pinned (served instead of the
repository's ``default_version`` or highest version, until a load without a
version unpins it). ``restrict`` applies them to a repository plan; ``settle``
answers each request once what is served shows it done, or says why it cannot
be (not in the repository, a version that failed to load: the version serving
keeps serving). ``ControlClient`` is the ingress's side: it writes a request
and waits for its answer. What an operator loaded or unloaded lasts until the
hub stops: the run directory goes with it (Triton does not keep it either).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared import NAME_PATTERN, atomic_write_bytes

from ._spec import ExecutorSpec

__all__ = ["ControlAnswer", "ControlClient", "ControlRequest", "ModelControl"]

_ACTIONS = ("load", "unload")
_MAX_FILE_BYTES = 64 * 1024


@dataclass(frozen=True)
class ControlRequest:
    """One operator request: ``load`` (a ``version``, or the repository's choice) or ``unload``."""

    id: str
    action: str
    version: str | None = None

    @classmethod
    def from_json(cls, document: Any) -> ControlRequest | None:
        """The request ``document`` holds, or ``None`` if it is not one."""
        if not isinstance(document, dict):
            return None
        rid, action, version = document.get("id"), document.get("action"), document.get("version")
        if not isinstance(rid, str) or action not in _ACTIONS:
            return None
        if version is not None and not (isinstance(version, str) and version.isdecimal()):
            return None
        return cls(rid, action, version)


@dataclass(frozen=True)
class ControlAnswer:
    """What became of request ``id``: done (``ok``) or not, with the state and reason to report."""

    id: str
    action: str
    ok: bool
    state: str  # Triton's: READY or UNAVAILABLE
    version: str | None
    reason: str

    @classmethod
    def from_json(cls, document: Any) -> ControlAnswer | None:
        if not isinstance(document, dict):
            return None
        try:
            return cls(
                str(document["id"]),
                str(document["action"]),
                bool(document["ok"]),
                str(document["state"]),
                None if document.get("version") is None else str(document["version"]),
                str(document.get("reason", "")),
            )
        except (KeyError, TypeError):
            return None


class ModelControl:
    """The supervisor's side: reads requests, shapes the plan, writes answers."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.unloaded: set[str] = set()
        self.pinned: dict[str, str] = {}
        self._pending: dict[str, ControlRequest] = {}  # model -> its latest unanswered request
        self._seen: dict[str, str] = {}  # model -> the id of the last request taken
        self._pin_before: dict[str, str | None] = {}  # model -> its pin before a pending load

    def poll(self) -> bool:
        """Take new requests; True when there are some (the plan must be looked at again)."""
        taken = False
        for path in sorted(self.folder.glob("*.request.json")):
            model = path.name.removesuffix(".request.json")
            request = ControlRequest.from_json(_read(path))
            if request is None or self._seen.get(model) == request.id:
                continue
            self._seen[model] = request.id
            self._pending[model] = request
            if request.action == "unload":
                self.unloaded.add(model)
                self.pinned.pop(model, None)
            else:
                self.unloaded.discard(model)
                self._pin_before[model] = self.pinned.get(model)
                if request.version is None:
                    self.pinned.pop(model, None)
                else:
                    self.pinned[model] = request.version
            taken = True
        return taken

    def loading(self) -> set[str]:
        """The models with a load waiting (a version that failed before is tried again)."""
        return {model for model, r in self._pending.items() if r.action == "load"}

    def wanted(self) -> list[tuple[str, str]]:
        """(model, version) of each load waiting that names a version."""
        return [
            (model, r.version)
            for model, r in self._pending.items()
            if r.action == "load" and r.version is not None
        ]

    def restrict(self, plan: Iterable[ExecutorSpec]) -> tuple[ExecutorSpec, ...]:
        """``plan`` without the unloaded models."""
        return tuple(spec for spec in plan if spec.model not in self.unloaded)

    def settle(
        self,
        served: Mapping[str, str],
        not_loadable: Callable[[str, str | None], str | None],
        load_error: Callable[[str, str | None], str | None],
    ) -> None:
        """Answer what can be answered. ``served``: model -> the version serving now;
        ``not_loadable(model, version)``: why that model (version; None: the repository's
        choice) cannot be loaded, or None; ``load_error(model, version)``: why loading it
        failed, or None."""
        for model, request in list(self._pending.items()):
            answer = _answer(request, model, served, not_loadable, load_error)
            if answer is None:
                continue  # still to do: the next look at the plan does it
            before = self._pin_before.pop(model, None)
            if not answer.ok and request.action == "load":  # what serves keeps serving
                if before is None:
                    self.pinned.pop(model, None)
                else:
                    self.pinned[model] = before
            atomic_write_bytes(
                self.folder / f"{model}.answer.json", json.dumps(answer.__dict__).encode()
            )
            del self._pending[model]


def _answer(
    request: ControlRequest,
    model: str,
    served: Mapping[str, str],
    not_loadable: Callable[[str, str | None], str | None],
    load_error: Callable[[str, str | None], str | None],
) -> ControlAnswer | None:
    now = served.get(model)
    if request.action == "unload":
        if now is not None:
            return None
        return ControlAnswer(request.id, "unload", True, "UNAVAILABLE", None, "unloaded")
    if now is not None and request.version in (None, now):
        return ControlAnswer(request.id, "load", True, "READY", now, "")
    why = not_loadable(model, request.version) or load_error(model, request.version)
    if why is None:
        return None
    state = "READY" if now is not None else "UNAVAILABLE"
    kept = f"; version {now} keeps serving" if now is not None else ""
    return ControlAnswer(request.id, "load", False, state, now, f"{why}{kept}")


class ControlClient:
    """The ingress's side: ``await request(model, action, version)`` -> the supervisor's answer."""

    def __init__(self, folder: str | Path, *, poll_s: float = 0.05) -> None:
        self.folder = Path(folder)
        self.poll_s = poll_s

    async def request(
        self, model: str, action: str, version: str | None, *, timeout_s: float
    ) -> ControlAnswer | None:
        """Ask, and wait up to ``timeout_s`` for the answer (``None``: not answered by then)."""
        if not NAME_PATTERN.fullmatch(model) or action not in _ACTIONS:
            raise ValueError(f"cannot {action} {model!r:.80}")
        rid = uuid.uuid4().hex
        document = {"id": rid, "action": action, "version": version}
        atomic_write_bytes(self.folder / f"{model}.request.json", json.dumps(document).encode())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            answer = ControlAnswer.from_json(_read(self.folder / f"{model}.answer.json"))
            if answer is not None and answer.id == rid:
                return answer
            await asyncio.sleep(self.poll_s)
        return None

    def unloaded(self) -> list[str]:
        """The models whose last answered request unloaded them."""
        names = []
        for path in sorted(self.folder.glob("*.answer.json")):
            answer = ControlAnswer.from_json(_read(path))
            if answer is not None and answer.ok and answer.action == "unload":
                names.append(path.name.removesuffix(".answer.json"))
        return names


def _read(path: Path) -> Any:
    """The JSON in ``path``, or None when absent, too big or not (yet) JSON."""
    try:
        with path.open("rb") as f:
            raw = f.read(_MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(raw) > _MAX_FILE_BYTES:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None
