"""Which version of each model a hub serves, and where: written by the supervisor, read by ingress.

The supervisor owns the routes (model -> the served version and its
instances' addresses) and writes them to one JSON file in the hub's run
directory, atomically (a temporary file, then a rename): an ingress process
checks the file's identity (inode, size, modification time) on each tick
and hands new routes to its ``ExecutorPool``, which swaps the version in
without dropping requests. The file carries a generation number that only
grows.

``route_changes`` is the pure part of a version swap: given what is served
and what the repository now says (``plan_executors``), which models get a new
version (and the executors to start for it) and which are gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ._executor_pool import Route, Routes
from ._plane_spec import ExecutorSpec

__all__ = ["RouteChanges", "RoutesFile", "route_changes"]


@dataclass
class RouteChanges:
    """New versions to bring in (model -> the executors of that version) and models to drop."""

    incoming: dict[str, list[ExecutorSpec]] = field(default_factory=dict)
    gone: list[str] = field(default_factory=list)


def route_changes(served: Routes, desired: Iterable[ExecutorSpec]) -> RouteChanges:
    """What to start and stop to go from ``served`` to ``desired`` (one version per model)."""
    wanted: dict[str, list[ExecutorSpec]] = {}
    for spec in desired:
        wanted.setdefault(spec.model, []).append(spec)
    changes = RouteChanges()
    for model, specs in wanted.items():
        route = served.get(model)
        if route is None or route.version != specs[0].version:
            changes.incoming[model] = specs
    changes.gone = sorted(set(served) - set(wanted))
    return changes


class RoutesFile:
    """The routes file of one hub: ``write`` (the supervisor), ``read_if_changed`` (ingress)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.generation = 0
        self._seen: tuple[int, int, int] | None = None

    def write(self, routes: Routes) -> None:
        self.generation += 1
        document = {
            "generation": self.generation,
            "models": {
                model: {"version": r.version, "addresses": [_escape(a) for a in r.addresses]}
                for model, r in routes.items()
            },
        }
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".routes-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(document, f)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def read_if_changed(self) -> dict[str, Route] | None:
        """The routes, if the file changed since the last read (None: unchanged or absent)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if identity == self._seen:
            return None
        try:
            document = json.loads(self.path.read_text())
            routes = {
                model: Route(str(r["version"]), tuple(_unescape(a) for a in r["addresses"]))
                for model, r in document["models"].items()
            }
        except (OSError, ValueError, KeyError, TypeError):
            return None  # replaced while reading: the next tick reads the new one
        self._seen = identity
        self.generation = int(document.get("generation", 0))
        return routes


def _escape(address: str) -> str:
    return address.encode("unicode_escape").decode()  # abstract names start with NUL


def _unescape(address: str) -> str:
    return address.encode().decode("unicode_escape")
