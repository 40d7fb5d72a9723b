"""Where model versions, their signed manifests, device assignments, the fleet's
devices and rollouts are recorded.

Tables (layout in ``_rows``): ``models``, ``versions``, ``assignments``,
``devices`` (``DeviceRecord``: labels, capabilities, models running, first and
last seen, last telemetry) and ``rollouts`` (``RolloutRecord``: indexed fields
plus the controller's JSON snapshot); for several CDN replicas (``_leases``)
``leases`` (the rollout leader's lease and its fencing token) and
``rollout_commands`` (what followers queue for the leader). Opening a
registry creates the tables it lacks, so one made by an older release gains
them.

``open_registry(url)`` picks the backend from a URL:

- ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or a plain
  path: ``SqliteRegistry`` (the default; one file, no server);
- ``postgresql://user@host:5432/db`` (or ``postgres://``): ``PostgresRegistry``,
  for several servers and publishers sharing one database.

psycopg is imported only for a PostgreSQL URL. ``dump_document`` is the JSON text a
document is stored (and served) as, for those who measure it.
"""

from __future__ import annotations

import typing as _typing
from pathlib import Path as _Path

from .._errors import RegistryError as _RegistryError
from ._base import DeviceRecord, Registry, RolloutRecord, VersionRecord
from ._rows import dump_document
from ._sqlite import SqliteRegistry

if _typing.TYPE_CHECKING:
    from ._postgres import PostgresRegistry

__all__ = [
    "DeviceRecord",
    "PostgresRegistry",
    "Registry",
    "RolloutRecord",
    "SqliteRegistry",
    "VersionRecord",
    "dump_document",
    "open_registry",
]


def open_registry(url: str | _Path, *, create: bool = True) -> Registry:
    """The registry a URL names (see the module docstring).

    ``create=False``: a SQLite file must already exist (PostgreSQL tables are
    always created when missing; the database itself must exist).
    """
    if isinstance(url, _Path):
        return SqliteRegistry(url, create=create)
    if not isinstance(url, str) or not url.strip():
        raise _RegistryError("registry URL is empty: use sqlite:///path.db or postgresql://…")
    url = url.strip()
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from ._postgres import PostgresRegistry
        except ImportError as e:
            raise _RegistryError(
                "a PostgreSQL registry needs psycopg: pip install 'psycopg[binary]>=3.1'"
            ) from e
        return PostgresRegistry(url)
    if url.startswith("sqlite:"):
        if not url.startswith("sqlite:///") or url == "sqlite:///":
            raise _RegistryError(
                f"registry URL {url!r}: write sqlite:///relative.db or sqlite:////abs/path.db"
            )
        return SqliteRegistry(url[len("sqlite:///") :], create=create)
    if "://" in url:
        scheme = url.split("://", 1)[0]
        raise _RegistryError(
            f"registry URL scheme {scheme!r} is not supported: use sqlite:/// or postgresql://"
        )
    return SqliteRegistry(url, create=create)


def __getattr__(name: str) -> _typing.Any:
    # PostgresRegistry is exported without importing psycopg until someone asks for it.
    if name == "PostgresRegistry":
        from ._postgres import PostgresRegistry

        globals()[name] = PostgresRegistry
        return PostgresRegistry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
