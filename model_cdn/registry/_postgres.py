"""The PostgreSQL registry: for several CDN servers and publishers sharing one database.

Concurrency: ``add_version`` runs in one transaction that first makes sure
the model's row in ``models`` exists, then locks it (``SELECT … FOR UPDATE``)
before comparing the new version with the high-water mark. Two publishers of
the same model therefore take turns; the second one reads the first one's
committed mark and gets ``VersionConflictError``. The primary key on
``versions (name, version)`` backs this up: a unique violation is reported
as the same conflict.

Connections: a small pool of psycopg 3 connections in autocommit mode, one
per concurrent caller (the HTTP server calls from a thread pool); writes open
an explicit transaction. A connection that broke (server restart) is dropped
and replaced on the next call. Credentials never appear in error messages.

Tables: ``models``, ``versions``, ``assignments``, ``devices`` and
``rollouts`` (layout in ``_rows``), each created when missing. A batch of
devices goes in one transaction with one ``executemany`` (psycopg pipelines
it: one round trip per batch, not per row), in id order so that two
overlapping batches lock rows in the same order and never deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors

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

__all__ = ["PostgresRegistry"]

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS models (
        name TEXT PRIMARY KEY,
        latest_version BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS versions (
        name TEXT NOT NULL REFERENCES models(name),
        version BIGINT NOT NULL,
        manifest TEXT NOT NULL,
        blob_digest TEXT NOT NULL,
        published_at TEXT NOT NULL,
        PRIMARY KEY (name, version)
    )""",
    """CREATE TABLE IF NOT EXISTS assignments (
        device TEXT NOT NULL,
        model TEXT NOT NULL,
        document TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (device, model)
    )""",
    """CREATE TABLE IF NOT EXISTS devices (
        id TEXT PRIMARY KEY,
        labels TEXT NOT NULL,
        capabilities TEXT NOT NULL,
        models TEXT NOT NULL,
        first_seen DOUBLE PRECISION NOT NULL,
        last_seen DOUBLE PRECISION NOT NULL,
        telemetry TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS rollouts (
        id TEXT PRIMARY KEY,
        model TEXT NOT NULL,
        version BIGINT NOT NULL,
        state TEXT NOT NULL,
        snapshot TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS rollouts_state ON rollouts (state)",
    "CREATE INDEX IF NOT EXISTS rollouts_created_at ON rollouts (created_at)",
    """CREATE TABLE IF NOT EXISTS leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        token BIGINT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS rollout_commands (
        id TEXT PRIMARY KEY,
        verb TEXT NOT NULL,
        rollout_id TEXT,
        body TEXT,
        state TEXT NOT NULL,
        result TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        done_at DOUBLE PRECISION
    )""",
    "CREATE INDEX IF NOT EXISTS rollout_commands_pending ON rollout_commands (state, created_at)",
)
# The database's clock decides expiry, so the replicas' clocks do not have to agree.
_DB_NOW = "EXTRACT(EPOCH FROM clock_timestamp())::DOUBLE PRECISION"
_TAKE_LEASE = (
    "UPDATE leases SET token = CASE WHEN holder = %(holder)s THEN token ELSE token + 1 END, "
    f"holder = %(holder)s, expires_at = {_DB_NOW} + %(ttl)s "
    f"WHERE name = %(name)s AND (holder = %(holder)s OR expires_at <= {_DB_NOW}) "
    "RETURNING name, holder, token, expires_at"
)
_PUT_ASSIGNMENT = (
    "INSERT INTO assignments (device, model, document, updated_at) "
    "VALUES (%s, %s, %s, %s) ON CONFLICT (device, model) DO UPDATE SET "
    "document = excluded.document, updated_at = excluded.updated_at"
)
# An existing device keeps its earliest first_seen; everything else is replaced.
_UPSERT_DEVICE = (
    f"INSERT INTO devices ({DEVICE_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (id) DO UPDATE SET labels = excluded.labels, "
    "capabilities = excluded.capabilities, models = excluded.models, "
    "first_seen = LEAST(devices.first_seen, excluded.first_seen), "
    "last_seen = excluded.last_seen, telemetry = excluded.telemetry"
)
_PUT_ROLLOUT = (
    f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (id) DO UPDATE SET model = excluded.model, version = excluded.version, "
    "state = excluded.state, snapshot = excluded.snapshot, "
    "created_at = excluded.created_at, updated_at = excluded.updated_at"
)
# Serialises concurrent CREATE TABLE IF NOT EXISTS (which can race on the catalog).
_SCHEMA_LOCK_ID = 0x7A4D_C0DE
_COLUMNS = "name, version, manifest, blob_digest, published_at"
_MAX_IDLE = 8  # pooled connections kept open between calls
_CONNECT_TIMEOUT_S = 10


def _where(url: str) -> str:
    """``host:port/dbname`` of a connection URL, without user or password."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "PostgreSQL (unparsable URL)"
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


class PostgresRegistry(Registry):
    """A registry in a PostgreSQL database (``postgresql://user@host:5432/db``).

    The tables are created when missing. To keep them in their own schema, add
    ``options=-csearch_path%3Dmyschema`` to the URL's query.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self.where = _where(url)
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._closed = False
        with self._transaction("create the tables") as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_ID,))
            for statement in _SCHEMA:
                conn.execute(statement)

    # -- connections -------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self._url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S)
        except psycopg.Error as e:
            # The message of a failed connect names host and user, never the password.
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RegistryError(f"cannot connect to PostgreSQL at {self.where}: {first}") from e

    @contextmanager
    def _connection(self, action: str) -> Iterator[psycopg.Connection[Any]]:
        with self._lock:
            if self._closed:
                raise RegistryError(f"registry {self.where} is closed")
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed:
            conn = self._connect()
        try:
            yield conn
        except psycopg.Error as e:
            self._release(conn)
            raise RegistryError(f"registry {self.where}: cannot {action}: {e}") from e
        except BaseException:
            self._release(conn)
            raise
        self._release(conn)

    @contextmanager
    def _transaction(self, action: str) -> Iterator[psycopg.Connection[Any]]:
        with self._connection(action) as conn, conn.transaction():
            yield conn

    def _release(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            keep = not (self._closed or conn.closed or conn.broken) and len(self._idle) < _MAX_IDLE
            if keep:
                self._idle.append(conn)
        if not keep:
            conn.close()

    # -- Registry ----------------------------------------------------------

    def add_version(self, signed_manifest: dict[str, Any]) -> VersionRecord:
        manifest = manifest_fields(signed_manifest)
        text = dump_document(signed_manifest)
        name, version = manifest.name, manifest.version
        try:
            with self._transaction(f"add {name}@{version}") as conn:
                conn.execute(
                    "INSERT INTO models (name, latest_version) VALUES (%s, 0) "
                    "ON CONFLICT (name) DO NOTHING",
                    (name,),
                )
                row = conn.execute(
                    "SELECT latest_version FROM models WHERE name = %s FOR UPDATE", (name,)
                ).fetchone()
                latest = int(row[0]) if row else 0
                if version <= latest:
                    raise VersionConflictError(
                        f"{name}@{version} is not above the latest version {latest} "
                        "(versions only grow, deleted ones included)"
                    )
                conn.execute(
                    f"INSERT INTO versions ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s)",
                    (name, version, text, manifest.blob.digest, manifest.published_at),
                )
                conn.execute(
                    "UPDATE models SET latest_version = %s WHERE name = %s", (version, name)
                )
        except RegistryError as e:
            if isinstance(e.__cause__, pg_errors.UniqueViolation):
                raise VersionConflictError(f"{name}@{version} was published meanwhile") from e
            raise
        return VersionRecord(
            name=name,
            version=version,
            manifest=load_document(text),
            blob_digest=manifest.blob.digest,
            published_at=manifest.published_at,
        )

    def get_version(self, name: str, version: int | None = None) -> VersionRecord:
        check_name(name, "model name")
        with self._connection(f"read {name}") as conn:
            if version is None:
                row = conn.execute(
                    f"SELECT {_COLUMNS} FROM versions WHERE name = %s "
                    "ORDER BY version DESC LIMIT 1",
                    (name,),
                ).fetchone()
            else:
                row = conn.execute(
                    f"SELECT {_COLUMNS} FROM versions WHERE name = %s AND version = %s",
                    (name, check_version(version)),
                ).fetchone()
        if row is None:
            what = name if version is None else f"{name}@{version}"
            raise ModelNotFoundError(f"no model version {what} in the registry")
        return record_from_row(tuple(row))

    def list_models(self) -> list[str]:
        with self._connection("list models") as conn:
            rows = conn.execute("SELECT DISTINCT name FROM versions ORDER BY name").fetchall()
        return [r[0] for r in rows]

    def list_versions(self, name: str) -> list[VersionRecord]:
        check_name(name, "model name")
        with self._connection(f"list {name}") as conn:
            known = conn.execute("SELECT 1 FROM models WHERE name = %s", (name,)).fetchone()
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM versions WHERE name = %s ORDER BY version", (name,)
            ).fetchall()
        if known is None:
            raise ModelNotFoundError(f"no model {name!r} in the registry")
        return [record_from_row(tuple(r)) for r in rows]

    def delete_version(self, name: str, version: int) -> None:
        check_name(name, "model name")
        check_version(version)
        with self._transaction(f"delete {name}@{version}") as conn:
            gone = conn.execute(
                "DELETE FROM versions WHERE name = %s AND version = %s", (name, version)
            ).rowcount
        if not gone:
            raise ModelNotFoundError(f"no model version {name}@{version} in the registry")

    def put_assignment(self, device: str, model: str, signed_assignment: dict[str, Any]) -> None:
        assignment_fields(device, model, signed_assignment)
        text = dump_document(signed_assignment)
        with self._transaction(f"assign {model} to {device}") as conn:
            conn.execute(_PUT_ASSIGNMENT, (device, model, text, now_text()))

    def get_assignment(self, device: str, model: str) -> dict[str, Any] | None:
        check_name(device, "device id")
        check_name(model, "model name")
        with self._connection(f"read the assignment of {model} to {device}") as conn:
            row = conn.execute(
                "SELECT document FROM assignments WHERE device = %s AND model = %s",
                (device, model),
            ).fetchone()
        return None if row is None else load_document(row[0])

    def upsert_devices(self, records: Iterable[DeviceRecord]) -> None:
        rows = device_rows(records)
        if not rows:
            return
        with self._transaction(f"record {len(rows)} devices") as conn, conn.cursor() as cur:
            cur.executemany(_UPSERT_DEVICE, rows)

    def get_device(self, device: str) -> DeviceRecord:
        check_name(device, "device id")
        with self._connection(f"read device {device}") as conn:
            row = conn.execute(
                f"SELECT {DEVICE_COLUMNS} FROM devices WHERE id = %s", (device,)
            ).fetchone()
        if row is None:
            raise DeviceNotFoundError(f"no device {device!r} in the registry")
        return device_from_row(tuple(row))

    def list_devices(self) -> list[DeviceRecord]:
        with self._connection("list devices") as conn:
            rows = conn.execute(f"SELECT {DEVICE_COLUMNS} FROM devices ORDER BY id").fetchall()
        return [device_from_row(tuple(r)) for r in rows]

    def put_rollout(self, record: RolloutRecord) -> None:
        row = rollout_row(record)
        with self._transaction(f"record rollout {record.id}") as conn:
            conn.execute(_PUT_ROLLOUT, row)

    def get_rollout(self, rollout_id: str) -> RolloutRecord:
        check_rollout_id(rollout_id)
        with self._connection(f"read rollout {rollout_id}") as conn:
            row = conn.execute(
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE id = %s", (rollout_id,)
            ).fetchone()
        if row is None:
            raise RolloutNotFoundError(f"no rollout {rollout_id!r} in the registry")
        return rollout_from_row(tuple(row))

    def list_rollouts(self) -> list[RolloutRecord]:
        with self._connection("list rollouts") as conn:
            rows = conn.execute(
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts ORDER BY created_at DESC, id"
            ).fetchall()
        return [rollout_from_row(tuple(r)) for r in rows]

    # -- the rollout leader's lease and its command queue (``_leases``) --------------------

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease | None:
        check_lease(name, holder)
        with self._transaction(f"take the lease {name}") as conn:
            conn.execute(
                "INSERT INTO leases (name, holder, token, expires_at) VALUES (%s, '', 0, 0) "
                "ON CONFLICT (name) DO NOTHING",
                (name,),
            )
            row = conn.execute(
                _TAKE_LEASE, {"holder": holder, "name": name, "ttl": float(ttl_s)}
            ).fetchone()
        return None if row is None else Lease(row[0], row[1], int(row[2]), float(row[3]))

    def release_lease(self, fence: Fence) -> None:
        with self._transaction(f"release the lease {fence.lease}") as conn:
            conn.execute(
                "UPDATE leases SET expires_at = 0 WHERE name = %s AND holder = %s AND token = %s",
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
        with self._transaction("record a rollout's state") as conn:
            # FOR SHARE: a server taking the lease over (an UPDATE) waits for this commit
            if (
                fence is not None
                and not conn.execute(
                    "SELECT 1 FROM leases WHERE name = %s AND holder = %s AND token = %s FOR SHARE",
                    (fence.lease, fence.holder, fence.token),
                ).fetchone()
            ):
                raise LeaseLostError(f"the lease {fence.lease} changed hands: write refused")
            if (
                done is not None
                and not conn.execute(
                    "UPDATE rollout_commands SET state = %s, result = %s, done_at = %s "
                    "WHERE id = %s AND state = 'pending'",
                    (done[4], done[5], done[7], done[0]),
                ).rowcount
            ):
                return False  # withdrawn: nothing was written, an empty transaction commits
            if row is not None:
                conn.execute(_PUT_ROLLOUT, row)
            if docs:
                with conn.cursor() as cur:
                    cur.executemany(_PUT_ASSIGNMENT, docs)
        return True

    def add_rollout_command(self, command: RolloutCommand) -> None:
        row = command_row(command)
        with self._transaction(f"queue rollout command {command.id}") as conn:
            conn.execute(
                f"INSERT INTO rollout_commands ({COMMAND_COLUMNS}) VALUES "
                "(%s, %s, %s, %s, %s, %s, %s, %s)",
                row,
            )

    def pending_rollout_commands(self, limit: int = 100) -> list[RolloutCommand]:
        with self._connection("read the rollout commands") as conn:
            rows = conn.execute(
                f"SELECT {COMMAND_COLUMNS} FROM rollout_commands WHERE state = 'pending' "
                "ORDER BY created_at, id LIMIT %s",
                (limit,),
            ).fetchall()
        return [command_from_row(tuple(r)) for r in rows]

    def get_rollout_command(self, command_id: str) -> RolloutCommand | None:
        with self._connection(f"read rollout command {command_id:.40}") as conn:
            row = conn.execute(
                f"SELECT {COMMAND_COLUMNS} FROM rollout_commands WHERE id = %s", (command_id,)
            ).fetchone()
        return None if row is None else command_from_row(tuple(row))

    def withdraw_rollout_command(self, command_id: str) -> RolloutCommand | None:
        with self._transaction(f"withdraw rollout command {command_id:.40}") as conn:
            row = conn.execute(
                f"DELETE FROM rollout_commands WHERE id = %s RETURNING {COMMAND_COLUMNS}",
                (command_id,),
            ).fetchone()
        return None if row is None else command_from_row(tuple(row))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __repr__(self) -> str:
        return f"PostgresRegistry({self.where!r})"
