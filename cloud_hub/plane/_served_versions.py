"""Which version of each model a hub serves, and where: written by the supervisor, read by ingress.

The supervisor owns the served versions (model -> the served version and its
instances' addresses) and writes them to one JSON file in the hub's run
directory (``routes.json``, its name in older releases), atomically (a temporary
file, then a rename): an ingress process
checks the file's identity (inode, size, modification time) on each tick
and hands the new ones to its ``ExecutorPool``, which swaps the version in
without dropping requests. The file carries a generation number that only
grows.

``served_changes`` is the pure part of a version swap: given what is served
and what the repository now says (``plan_executors``), which models get a new
version (and the executors to start for it) and which are gone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from shared import atomic_write_bytes

from ._executor_pool import ServedVersion, ServedVersions
from ._spec import ExecutorSpec

__all__ = ["ServedChanges", "ServedVersionsFile", "served_changes"]


@dataclass
class ServedChanges:
    """New versions to bring in (model -> the executors of that version) and models to drop."""

    incoming: dict[str, list[ExecutorSpec]] = field(default_factory=dict)
    gone: list[str] = field(default_factory=list)


def served_changes(served: ServedVersions, desired: Iterable[ExecutorSpec]) -> ServedChanges:
    """What to start and stop to go from ``served`` to ``desired`` (one version per model)."""
    wanted: dict[str, list[ExecutorSpec]] = {}
    for spec in desired:
        wanted.setdefault(spec.model, []).append(spec)
    changes = ServedChanges()
    for model, specs in wanted.items():
        current = served.get(model)
        if current is None or current.version != specs[0].version:
            changes.incoming[model] = specs
    changes.gone = sorted(set(served) - set(wanted))
    return changes


class ServedVersionsFile:
    """One hub's served-versions file: ``write`` (the supervisor), ``read_if_changed`` (ingress)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.generation = 0
        self._seen: tuple[int, int, int] | None = None

    def write(self, served: ServedVersions) -> None:
        self.generation += 1
        document = {
            "generation": self.generation,
            "models": {
                model: {"version": r.version, "addresses": [_escape(a) for a in r.addresses]}
                for model, r in served.items()
            },
        }
        atomic_write_bytes(self.path, json.dumps(document).encode(), mode=0o600)

    def read_if_changed(self) -> dict[str, ServedVersion] | None:
        """The served versions, if the file changed since the last read (None: not, or absent)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if identity == self._seen:
            return None
        try:
            document = json.loads(self.path.read_text())
            served = {
                model: ServedVersion(str(r["version"]), tuple(_unescape(a) for a in r["addresses"]))
                for model, r in document["models"].items()
            }
        except (OSError, ValueError, KeyError, TypeError):
            return None  # replaced while reading: the next tick reads the new one
        self._seen = identity
        self.generation = int(document.get("generation", 0))
        return served


def _escape(address: str) -> str:
    return address.encode("unicode_escape").decode()  # abstract names start with NUL


def _unescape(address: str) -> str:
    return address.encode().decode("unicode_escape")
