"""The SQLite registry: the default, one file, no server.

Concurrency: WAL journal (readers never block the writer), one connection
per thread (``sqlite3`` connections are not for sharing), and every write in
a ``BEGIN IMMEDIATE`` transaction, which takes the database's write lock
before the first read. So ``add_version``'s "above the latest?" check and
its insert see the same state even with several publishers in several
processes: the second one waits for the lock (``busy_timeout``) and then
sees the first one's version.

Tables: ``models``, ``versions``, ``assignments``, ``devices`` and
``rollouts`` (layout in ``_rows``), each created when missing, so a file
from before the fleet tables existed gains them when it is opened.
``upsert_devices`` writes a whole batch with one ``executemany`` inside
one transaction: a thousand heartbeats cost one commit, not a thousand.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._errors import (
    DeviceNotFoundError,
    LeaseLostError,
    ModelNotFoundError,
    RegistryError,
    RolloutNotFoundError,
    VersionConflictError,
)
from ._base import AssignmentWrite, DeviceRecord, Registry, RolloutRecord, VersionRecord
from ._leases import (
    COMMAND_COLUMNS,
    Fence,
    Lease,
    RolloutCommand,
    check_lease,
    command_from_row,
    command_row,
)
from ._rows import (
    DEVICE_COLUMNS,
    ROLLOUT_COLUMNS,
    assignment_fields,
    check_name,
    check_rollout_id,
    check_version,
    device_from_row,
    device_rows,
    dump_document,
    load_document,
    manifest_fields,
    now_text,
    record_from_row,
    rollout_from_row,
    rollout_row,
)

__all__ = ["SqliteRegistry"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS models (
    name TEXT PRIMARY KEY,
    latest_version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS versions (
    name TEXT NOT NULL REFERENCES models(name),
    version INTEGER NOT NULL,
    manifest TEXT NOT NULL,
    blob_digest TEXT NOT NULL,
    published_at TEXT NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS assignments (
    device TEXT NOT NULL,
    model TEXT NOT NULL,
    document TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (device, model)
);
CREATE TABLE IF NOT EXISTS devices (
    id TEXT PRIMARY KEY,
    labels TEXT NOT NULL,
    capabilities TEXT NOT NULL,
    models TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    telemetry TEXT
);
CREATE TABLE IF NOT EXISTS rollouts (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    version INTEGER NOT NULL,
    state TEXT NOT NULL,
    snapshot TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rollouts_state ON rollouts (state);
CREATE INDEX IF NOT EXISTS rollouts_created_at ON rollouts (created_at);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rollout_commands (
    id TEXT PRIMARY KEY,
    verb TEXT NOT NULL,
    rollout_id TEXT,
    body TEXT,
    state TEXT NOT NULL,
    result TEXT,
    created_at REAL NOT NULL,
    done_at REAL
);
CREATE INDEX IF NOT EXISTS rollout_commands_pending ON rollout_commands (state, created_at);
"""
# An existing device keeps its earliest first_seen; everything else is replaced.
_UPSERT_DEVICE = (
    f"INSERT INTO devices ({DEVICE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET labels = excluded.labels, "
    "capabilities = excluded.capabilities, models = excluded.models, "
    "first_seen = min(devices.first_seen, excluded.first_seen), "
    "last_seen = excluded.last_seen, telemetry = excluded.telemetry"
)
_PUT_ROLLOUT = (
    f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET model = excluded.model, version = excluded.version, "
    "state = excluded.state, snapshot = excluded.snapshot, "
    "created_at = excluded.created_at, updated_at = excluded.updated_at"
)
_COLUMNS = "name, version, manifest, blob_digest, published_at"
_BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another's transaction


class SqliteRegistry(Registry):
    """A registry in one SQLite file (created, with its tables, when missing).

    ``create=False`` refuses a missing file instead, so that a read-only
    command with a mistyped path does not leave an empty registry behind.
    """

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise RegistryError(f"no registry at {self.path}")
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RegistryError(f"cannot create {self.path.parent}: {e}") from e
        with self._errors("create the tables"):
            self._connection().executescript(_SCHEMA)

    # -- connections -------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        with self._lock:
            if self._closed:
                raise RegistryError(f"registry {self.path} is closed")
            # isolation_level=None: we issue BEGIN/COMMIT ourselves.
            # check_same_thread=False only so that close() may close every thread's connection.
            conn = sqlite3.connect(
                self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            self._connections.append(conn)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA synchronous=NORMAL")  # durable in WAL mode up to the last commit
        self._local.conn = conn
        return conn

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as e:
            raise RegistryError(f"registry {self.path}: cannot {action}: {e}") from e

    @contextmanager
    def _write(self, action: str) -> Iterator[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction, committed on success, rolled back on any error."""
        with self._errors(action):
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    # -- Registry ----------------------------------------------------------

    def add_version(self, signed_manifest: dict[str, Any]) -> VersionRecord:
        manifest = manifest_fields(signed_manifest)
        text = dump_document(signed_manifest)
        with self._write(f"add {manifest.name}@{manifest.version}") as conn:
            row = conn.execute(
                "SELECT latest_version FROM models WHERE name = ?", (manifest.name,)
            ).fetchone()
            latest = 0 if row is None else int(row[0])
            if manifest.version <= latest:
                raise VersionConflictError(
                    f"{manifest.name}@{manifest.version} is not above the latest version "
                    f"{latest} (versions only grow, deleted ones included)"
                )
            conn.execute(
                "INSERT INTO models (name, latest_version) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET latest_version = excluded.latest_version",
                (manifest.name, manifest.version),
            )
            conn.execute(
                f"INSERT INTO versions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                (
                    manifest.name,
                    manifest.version,
                    text,
                    manifest.blob.digest,
                    manifest.published_at,
                ),
            )
        return VersionRecord(
            name=manifest.name,
            version=manifest.version,
            manifest=load_document(text),
            blob_digest=manifest.blob.digest,
            published_at=manifest.published_at,
        )

    def get_version(self, name: str, version: int | None = None) -> VersionRecord:
        check_name(name, "model name")
        with self._errors(f"read {name}"):
            if version is None:
                row = (
                    self._connection()
                    .execute(
                        f"SELECT {_COLUMNS} FROM versions WHERE name = ? "
                        "ORDER BY version DESC LIMIT 1",
                        (name,),
                    )
                    .fetchone()
                )
            else:
                row = (
                    self._connection()
                    .execute(
                        f"SELECT {_COLUMNS} FROM versions WHERE name = ? AND version = ?",
                        (name, check_version(version)),
                    )
                    .fetchone()
                )
        if row is None:
            what = name if version is None else f"{name}@{version}"
            raise ModelNotFoundError(f"no model version {what} in the registry")
        return record_from_row(row)

    def list_models(self) -> list[str]:
        with self._errors("list models"):
            rows = (
                self._connection()
                .execute("SELECT DISTINCT name FROM versions ORDER BY name")
                .fetchall()
            )
        return [r[0] for r in rows]

    def list_versions(self, name: str) -> list[VersionRecord]:
        check_name(name, "model name")
        with self._errors(f"list {name}"):
            conn = self._connection()
            known = conn.execute("SELECT 1 FROM models WHERE name = ?", (name,)).fetchone()
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM versions WHERE name = ? ORDER BY version", (name,)
            ).fetchall()
        if known is None:
            raise ModelNotFoundError(f"no model {name!r} in the registry")
        return [record_from_row(r) for r in rows]

    def delete_version(self, name: str, version: int) -> None:
        check_name(name, "model name")
        check_version(version)
        with self._write(f"delete {name}@{version}") as conn:
            gone = conn.execute(
                "DELETE FROM versions WHERE name = ? AND version = ?", (name, version)
            ).rowcount
        if not gone:
            raise ModelNotFoundError(f"no model version {name}@{version} in the registry")

    def put_assignment(self, device: str, model: str, signed_assignment: dict[str, Any]) -> None:
        assignment_fields(device, model, signed_assignment)
        text = dump_document(signed_assignment)
        with self._write(f"assign {model} to {device}") as conn:
            conn.execute(
                "INSERT INTO assignments (device, model, document, updated_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (device, model) DO UPDATE SET "
                "document = excluded.document, updated_at = excluded.updated_at",
                (device, model, text, now_text()),
            )

    def get_assignment(self, device: str, model: str) -> dict[str, Any] | None:
        check_name(device, "device id")
        check_name(model, "model name")
        with self._errors(f"read the assignment of {model} to {device}"):
            row = (
                self._connection()
                .execute(
                    "SELECT document FROM assignments WHERE device = ? AND model = ?",
                    (device, model),
                )
                .fetchone()
            )
        return None if row is None else load_document(row[0])

    def upsert_devices(self, records: Iterable[DeviceRecord]) -> None:
        rows = device_rows(records)
        if not rows:
            return
        with self._write(f"record {len(rows)} devices") as conn:
            conn.executemany(_UPSERT_DEVICE, rows)

    def get_device(self, device: str) -> DeviceRecord:
        check_name(device, "device id")
        with self._errors(f"read device {device}"):
            row = (
                self._connection()
                .execute(f"SELECT {DEVICE_COLUMNS} FROM devices WHERE id = ?", (device,))
                .fetchone()
            )
        if row is None:
            raise DeviceNotFoundError(f"no device {device!r} in the registry")
        return device_from_row(row)

    def list_devices(self) -> list[DeviceRecord]:
        with self._errors("list devices"):
            rows = (
                self._connection()
                .execute(f"SELECT {DEVICE_COLUMNS} FROM devices ORDER BY id")
                .fetchall()
            )
        return [device_from_row(r) for r in rows]

    def put_rollout(self, record: RolloutRecord) -> None:
        row = rollout_row(record)
        with self._write(f"record rollout {record.id}") as conn:
            conn.execute(_PUT_ROLLOUT, row)

    def get_rollout(self, rollout_id: str) -> RolloutRecord:
        check_rollout_id(rollout_id)
        with self._errors(f"read rollout {rollout_id}"):
            row = (
                self._connection()
                .execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE id = ?", (rollout_id,))
                .fetchone()
            )
        if row is None:
            raise RolloutNotFoundError(f"no rollout {rollout_id!r} in the registry")
        return rollout_from_row(row)

    def list_rollouts(self) -> list[RolloutRecord]:
        with self._errors("list rollouts"):
            rows = (
                self._connection()
                .execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts ORDER BY created_at DESC, id")
                .fetchall()
            )
        return [rollout_from_row(r) for r in rows]

    # -- the rollout leader's lease and its command queue (``_leases``) --------------------

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease | None:
        check_lease(name, holder)
        with self._write(f"take the lease {name}") as conn:
            now = time.time()  # one host's file: its clock is every holder's clock
            conn.execute(
                "INSERT INTO leases (name, holder, token, expires_at) VALUES (?, '', 0, 0) "
                "ON CONFLICT (name) DO NOTHING",
                (name,),
            )
            row = conn.execute(
                "UPDATE leases SET token = CASE WHEN holder = ? THEN token ELSE token + 1 END, "
                "holder = ?, expires_at = ? WHERE name = ? AND (holder = ? OR expires_at <= ?) "
                "RETURNING name, holder, token, expires_at",
                (holder, holder, now + ttl_s, name, holder, now),
            ).fetchone()
        return None if row is None else Lease(row[0], row[1], int(row[2]), float(row[3]))

    def release_lease(self, fence: Fence) -> None:
        with self._write(f"release the lease {fence.lease}") as conn:
            conn.execute(
                "UPDATE leases SET expires_at = 0 WHERE name = ? AND holder = ? AND token = ?",
                (fence.lease, fence.holder, fence.token),
            )

    def commit_rollout(
        self,
        record: RolloutRecord | None,
        assignments: Sequence[AssignmentWrite] = (),
        *,
        fence: Fence | None = None,
        command: RolloutCommand | None = None,
    ) -> bool:
        row = None if record is None else rollout_row(record)
        docs = []
        for a in assignments:
            assignment_fields(a.device, a.model, a.document)
            docs.append((a.device, a.model, dump_document(a.document), now_text()))
        done = None if command is None else command_row(command)
        with self._write("record a rollout's state") as conn:
            if (
                fence is not None
                and not conn.execute(
                    "SELECT 1 FROM leases WHERE name = ? AND holder = ? AND token = ?",
                    (fence.lease, fence.holder, fence.token),
                ).fetchone()
            ):
                raise LeaseLostError(f"the lease {fence.lease} changed hands: write refused")
            if (
                done is not None
                and not conn.execute(
                    "UPDATE rollout_commands SET state = ?, result = ?, done_at = ? "
                    "WHERE id = ? AND state = 'pending'",
                    (done[4], done[5], done[7], done[0]),
                ).rowcount
            ):
                return False  # withdrawn: nothing was written, an empty transaction commits
            if row is not None:
                conn.execute(_PUT_ROLLOUT, row)
            conn.executemany(
                "INSERT INTO assignments (device, model, document, updated_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (device, model) DO UPDATE SET "
                "document = excluded.document, updated_at = excluded.updated_at",
                docs,
            )
        return True

    def add_rollout_command(self, command: RolloutCommand) -> None:
        row = command_row(command)
        with self._write(f"queue rollout command {command.id}") as conn:
            conn.execute(
                f"INSERT INTO rollout_commands ({COMMAND_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )

    def pending_rollout_commands(self, limit: int = 100) -> list[RolloutCommand]:
        with self._errors("read the rollout commands"):
            rows = (
                self._connection()
                .execute(
                    f"SELECT {COMMAND_COLUMNS} FROM rollout_commands WHERE state = 'pending' "
                    "ORDER BY created_at, id LIMIT ?",
                    (limit,),
                )
                .fetchall()
            )
        return [command_from_row(r) for r in rows]

    def get_rollout_command(self, command_id: str) -> RolloutCommand | None:
        with self._errors(f"read rollout command {command_id:.40}"):
            row = (
                self._connection()
                .execute(
                    f"SELECT {COMMAND_COLUMNS} FROM rollout_commands WHERE id = ?", (command_id,)
                )
                .fetchone()
            )
        return None if row is None else command_from_row(row)

    def withdraw_rollout_command(self, command_id: str) -> RolloutCommand | None:
        with self._write(f"withdraw rollout command {command_id:.40}") as conn:
            row = conn.execute(
                f"DELETE FROM rollout_commands WHERE id = ? RETURNING {COMMAND_COLUMNS}",
                (command_id,),
            ).fetchone()
        return None if row is None else command_from_row(row)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"SqliteRegistry({str(self.path)!r})"
