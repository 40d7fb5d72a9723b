"""The registry's SQL, written once for SQLite and PostgreSQL.

``SqlRegistry`` holds every statement and every ``Registry`` method; a
backend (``_sqlite``, ``_postgres``) adds only its connections and
transactions (``_read``, ``_write``) and a ``Dialect``: what differs in the
text of a statement between the two databases.

Statements are written in sqlite3's style: ``?`` for a positional
parameter, ``:name`` for a named one; a ``pyformat`` dialect (psycopg) gets
``%s`` and ``%(name)s`` instead. ``{integer}`` and ``{real}`` are the column
types, ``{least}`` the two-argument minimum, ``{for_update}`` and
``{for_share}`` the row locks a read takes inside a write transaction (none
where the transaction already holds the whole database's write lock), and
``{now}`` the lease clock: the database's own where it has one that every
replica shares, else ``:now``, the caller's clock passed as a parameter.

Concurrency, the same on both: every write runs in one transaction that
locks what it reads before deciding (SQLite: ``BEGIN IMMEDIATE`` takes the
write lock first; PostgreSQL: ``SELECT … FOR UPDATE`` / ``FOR SHARE``). So
``add_version``'s "above the latest?" check and its insert see the same
state with several publishers in several processes, and a fenced write
checks the lease (holder and token) in the transaction that writes. A batch
of devices or assignments is one ``executemany`` in one transaction.
"""

from __future__ import annotations

import re
import time
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, closing
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

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

__all__ = ["SCHEMA", "Dialect", "SqlRegistry"]


@dataclass(frozen=True)
class Dialect:
    """What differs in a statement's text between two databases."""

    integer: str  # a 64-bit integer column
    real: str  # a double-precision column
    least: str  # the two-argument minimum function
    for_update: str  # after a SELECT that reads a row this transaction will write
    for_share: str  # after a SELECT whose row must not change before this commit
    clock: str | None  # epoch seconds by the database's clock; None: the caller's, as :now
    pyformat: bool = False  # %s and %(name)s instead of ? and :name

    def sql(self, template: str) -> str:
        """``template`` (a statement in this module's notation) as this database reads it."""
        return _render(self, template)


@cache
def _render(dialect: Dialect, template: str) -> str:
    if dialect.pyformat:  # before the fragments go in: the clock's ``::`` is not a parameter
        template = re.sub(r":([a-z_]+)", r"%(\1)s", template).replace("?", "%s")
    return template.format(
        integer=dialect.integer,
        real=dialect.real,
        least=dialect.least,
        for_update=dialect.for_update,
        for_share=dialect.for_share,
        now=":now" if dialect.clock is None else dialect.clock,
    )


SCHEMA = (
    """CREATE TABLE IF NOT EXISTS models (
        name TEXT PRIMARY KEY,
        latest_version {integer} NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS versions (
        name TEXT NOT NULL REFERENCES models(name),
        version {integer} NOT NULL,
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
        first_seen {real} NOT NULL,
        last_seen {real} NOT NULL,
        telemetry TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS rollouts (
        id TEXT PRIMARY KEY,
        model TEXT NOT NULL,
        version {integer} NOT NULL,
        state TEXT NOT NULL,
        snapshot TEXT NOT NULL,
        created_at {real} NOT NULL,
        updated_at {real} NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS rollouts_state ON rollouts (state)",
    "CREATE INDEX IF NOT EXISTS rollouts_created_at ON rollouts (created_at)",
    """CREATE TABLE IF NOT EXISTS leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        token {integer} NOT NULL,
        expires_at {real} NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS rollout_commands (
        id TEXT PRIMARY KEY,
        verb TEXT NOT NULL,
        rollout_id TEXT,
        body TEXT,
        state TEXT NOT NULL,
        result TEXT,
        created_at {real} NOT NULL,
        done_at {real}
    )""",
    "CREATE INDEX IF NOT EXISTS rollout_commands_pending ON rollout_commands (state, created_at)",
)

_COLUMNS = "name, version, manifest, blob_digest, published_at"
_ADD_MODEL = "INSERT INTO models (name, latest_version) VALUES (?, 0) ON CONFLICT (name) DO NOTHING"
_LATEST = "SELECT latest_version FROM models WHERE name = ? {for_update}"
_ADD_VERSION = f"INSERT INTO versions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?)"
_RAISE_LATEST = "UPDATE models SET latest_version = ? WHERE name = ?"
_GET_LATEST = f"SELECT {_COLUMNS} FROM versions WHERE name = ? ORDER BY version DESC LIMIT 1"
_GET_VERSION = f"SELECT {_COLUMNS} FROM versions WHERE name = ? AND version = ?"
_LIST_MODELS = "SELECT DISTINCT name FROM versions ORDER BY name"
_KNOWN_MODEL = "SELECT 1 FROM models WHERE name = ?"
_LIST_VERSIONS = f"SELECT {_COLUMNS} FROM versions WHERE name = ? ORDER BY version"
_DELETE_VERSION = "DELETE FROM versions WHERE name = ? AND version = ?"
_PUT_ASSIGNMENT = (
    "INSERT INTO assignments (device, model, document, updated_at) "
    "VALUES (?, ?, ?, ?) ON CONFLICT (device, model) DO UPDATE SET "
    "document = excluded.document, updated_at = excluded.updated_at"
)
_GET_ASSIGNMENT = "SELECT document FROM assignments WHERE device = ? AND model = ?"
# An existing device keeps its earliest first_seen; everything else is replaced.
_UPSERT_DEVICE = (
    f"INSERT INTO devices ({DEVICE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET labels = excluded.labels, "
    "capabilities = excluded.capabilities, models = excluded.models, "
    "first_seen = {least}(devices.first_seen, excluded.first_seen), "
    "last_seen = excluded.last_seen, telemetry = excluded.telemetry"
)
_GET_DEVICE = f"SELECT {DEVICE_COLUMNS} FROM devices WHERE id = ?"
_LIST_DEVICES = f"SELECT {DEVICE_COLUMNS} FROM devices ORDER BY id"
_PUT_ROLLOUT = (
    f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET model = excluded.model, version = excluded.version, "
    "state = excluded.state, snapshot = excluded.snapshot, "
    "created_at = excluded.created_at, updated_at = excluded.updated_at"
)
_GET_ROLLOUT = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE id = ?"
_LIST_ROLLOUTS = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts ORDER BY created_at DESC, id"
_ADD_LEASE = (
    "INSERT INTO leases (name, holder, token, expires_at) VALUES (?, '', 0, 0) "
    "ON CONFLICT (name) DO NOTHING"
)
# The token grows only when the lease changes hands; a holder renewing keeps it.
_TAKE_LEASE = (
    "UPDATE leases SET token = CASE WHEN holder = :holder THEN token ELSE token + 1 END, "
    "holder = :holder, expires_at = {now} + :ttl "
    "WHERE name = :name AND (holder = :holder OR expires_at <= {now}) "
    "RETURNING name, holder, token, expires_at"
)
_RELEASE_LEASE = "UPDATE leases SET expires_at = 0 WHERE name = ? AND holder = ? AND token = ?"
# The fence: holder AND token, so a holder that lost the lease and took it back is refused too.
_CHECK_FENCE = "SELECT 1 FROM leases WHERE name = ? AND holder = ? AND token = ? {for_share}"
_ANSWER_COMMAND = (
    "UPDATE rollout_commands SET state = ?, result = ?, done_at = ? "
    "WHERE id = ? AND state = 'pending'"
)
_ADD_COMMAND = f"INSERT INTO rollout_commands ({COMMAND_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_PENDING_COMMANDS = (
    f"SELECT {COMMAND_COLUMNS} FROM rollout_commands WHERE state = 'pending' "
    "ORDER BY created_at, id LIMIT ?"
)
_GET_COMMAND = f"SELECT {COMMAND_COLUMNS} FROM rollout_commands WHERE id = ?"
_WITHDRAW_COMMAND = f"DELETE FROM rollout_commands WHERE id = ? RETURNING {COMMAND_COLUMNS}"


class SqlRegistry(Registry):
    """Every ``Registry`` method over a DB-API connection; a backend adds the connections.

    A backend sets ``dialect`` and implements ``_read`` (a connection whose
    statements each commit on their own) and ``_write`` (a transaction:
    committed when the block ends, rolled back when it raises); both turn
    the driver's errors into ``RegistryError`` ("registry …: cannot
    {action}: …").
    """

    dialect: ClassVar[Dialect]

    @abstractmethod
    def _read(self, action: str) -> AbstractContextManager[Any]: ...

    @abstractmethod
    def _write(self, action: str) -> AbstractContextManager[Any]: ...

    def _unique_violation(self, error: BaseException | None) -> bool:
        """Whether a driver error is a primary-key clash (a concurrent publish)."""
        return False

    def _run(self, conn: Any, template: str, params: Any = None) -> Any:
        sql = self.dialect.sql(template)
        return conn.execute(sql) if params is None else conn.execute(sql, params)

    def _run_many(self, conn: Any, template: str, rows: Sequence[Any]) -> None:
        with closing(conn.cursor()) as cur:
            cur.executemany(self.dialect.sql(template), rows)

    def _create_tables(self, conn: Any) -> None:
        """Run ``SCHEMA`` (each table and index ``IF NOT EXISTS``) on ``conn``."""
        for statement in SCHEMA:
            self._run(conn, statement)

    # -- Registry ----------------------------------------------------------

    def add_version(self, signed_manifest: dict[str, Any]) -> VersionRecord:
        manifest = manifest_fields(signed_manifest)
        text = dump_document(signed_manifest)
        name, version = manifest.name, manifest.version
        try:
            with self._write(f"add {name}@{version}") as conn:
                self._run(conn, _ADD_MODEL, (name,))
                row = self._run(conn, _LATEST, (name,)).fetchone()
                latest = int(row[0]) if row else 0
                if version <= latest:
                    raise VersionConflictError(
                        f"{name}@{version} is not above the latest version {latest} "
                        "(versions only grow, deleted ones included)"
                    )
                self._run(
                    conn,
                    _ADD_VERSION,
                    (name, version, text, manifest.blob.digest, manifest.published_at),
                )
                self._run(conn, _RAISE_LATEST, (version, name))
        except RegistryError as e:
            if self._unique_violation(e.__cause__):
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
        with self._read(f"read {name}") as conn:
            if version is None:
                row = self._run(conn, _GET_LATEST, (name,)).fetchone()
            else:
                row = self._run(conn, _GET_VERSION, (name, check_version(version))).fetchone()
        if row is None:
            what = name if version is None else f"{name}@{version}"
            raise ModelNotFoundError(f"no model version {what} in the registry")
        return record_from_row(tuple(row))

    def list_models(self) -> list[str]:
        with self._read("list models") as conn:
            rows = self._run(conn, _LIST_MODELS).fetchall()
        return [r[0] for r in rows]

    def list_versions(self, name: str) -> list[VersionRecord]:
        check_name(name, "model name")
        with self._read(f"list {name}") as conn:
            known = self._run(conn, _KNOWN_MODEL, (name,)).fetchone()
            rows = self._run(conn, _LIST_VERSIONS, (name,)).fetchall()
        if known is None:
            raise ModelNotFoundError(f"no model {name!r} in the registry")
        return [record_from_row(tuple(r)) for r in rows]

    def delete_version(self, name: str, version: int) -> None:
        check_name(name, "model name")
        check_version(version)
        with self._write(f"delete {name}@{version}") as conn:
            gone = self._run(conn, _DELETE_VERSION, (name, version)).rowcount
        if not gone:
            raise ModelNotFoundError(f"no model version {name}@{version} in the registry")

    def put_assignment(self, device: str, model: str, signed_assignment: dict[str, Any]) -> None:
        assignment_fields(device, model, signed_assignment)
        text = dump_document(signed_assignment)
        with self._write(f"assign {model} to {device}") as conn:
            self._run(conn, _PUT_ASSIGNMENT, (device, model, text, now_text()))

    def get_assignment(self, device: str, model: str) -> dict[str, Any] | None:
        check_name(device, "device id")
        check_name(model, "model name")
        with self._read(f"read the assignment of {model} to {device}") as conn:
            row = self._run(conn, _GET_ASSIGNMENT, (device, model)).fetchone()
        return None if row is None else load_document(row[0])

    def upsert_devices(self, records: Iterable[DeviceRecord]) -> None:
        rows = device_rows(records)
        if not rows:
            return
        with self._write(f"record {len(rows)} devices") as conn:
            self._run_many(conn, _UPSERT_DEVICE, rows)

    def get_device(self, device: str) -> DeviceRecord:
        check_name(device, "device id")
        with self._read(f"read device {device}") as conn:
            row = self._run(conn, _GET_DEVICE, (device,)).fetchone()
        if row is None:
            raise DeviceNotFoundError(f"no device {device!r} in the registry")
        return device_from_row(tuple(row))

    def list_devices(self) -> list[DeviceRecord]:
        with self._read("list devices") as conn:
            rows = self._run(conn, _LIST_DEVICES).fetchall()
        return [device_from_row(tuple(r)) for r in rows]

    def put_rollout(self, record: RolloutRecord) -> None:
        row = rollout_row(record)
        with self._write(f"record rollout {record.id}") as conn:
            self._run(conn, _PUT_ROLLOUT, row)

    def get_rollout(self, rollout_id: str) -> RolloutRecord:
        check_rollout_id(rollout_id)
        with self._read(f"read rollout {rollout_id}") as conn:
            row = self._run(conn, _GET_ROLLOUT, (rollout_id,)).fetchone()
        if row is None:
            raise RolloutNotFoundError(f"no rollout {rollout_id!r} in the registry")
        return rollout_from_row(tuple(row))

    def list_rollouts(self) -> list[RolloutRecord]:
        with self._read("list rollouts") as conn:
            rows = self._run(conn, _LIST_ROLLOUTS).fetchall()
        return [rollout_from_row(tuple(r)) for r in rows]

    # -- the rollout leader's lease and its command queue (``_leases``) --------------------

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease | None:
        check_lease(name, holder)
        params: dict[str, Any] = {"holder": holder, "name": name, "ttl": float(ttl_s)}
        with self._write(f"take the lease {name}") as conn:
            if self.dialect.clock is None:
                params["now"] = time.time()  # one host's file: its clock is every holder's
            self._run(conn, _ADD_LEASE, (name,))
            row = self._run(conn, _TAKE_LEASE, params).fetchone()
        return None if row is None else Lease(row[0], row[1], int(row[2]), float(row[3]))

    def release_lease(self, fence: Fence) -> None:
        with self._write(f"release the lease {fence.lease}") as conn:
            self._run(conn, _RELEASE_LEASE, (fence.lease, fence.holder, fence.token))

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
            # The check and the writes are one transaction: a server taking the lease over
            # waits for this commit (SQLite: the write lock; PostgreSQL: FOR SHARE).
            if (
                fence is not None
                and not self._run(
                    conn, _CHECK_FENCE, (fence.lease, fence.holder, fence.token)
                ).fetchone()
            ):
                raise LeaseLostError(f"the lease {fence.lease} changed hands: write refused")
            if (
                done is not None
                and not self._run(
                    conn, _ANSWER_COMMAND, (done[4], done[5], done[7], done[0])
                ).rowcount
            ):
                return False  # withdrawn: nothing was written, an empty transaction commits
            if row is not None:
                self._run(conn, _PUT_ROLLOUT, row)
            if docs:
                self._run_many(conn, _PUT_ASSIGNMENT, docs)
        return True

    def add_rollout_command(self, command: RolloutCommand) -> None:
        row = command_row(command)
        with self._write(f"queue rollout command {command.id}") as conn:
            self._run(conn, _ADD_COMMAND, row)

    def pending_rollout_commands(self, limit: int = 100) -> list[RolloutCommand]:
        with self._read("read the rollout commands") as conn:
            rows = self._run(conn, _PENDING_COMMANDS, (limit,)).fetchall()
        return [command_from_row(tuple(r)) for r in rows]

    def get_rollout_command(self, command_id: str) -> RolloutCommand | None:
        with self._read(f"read rollout command {command_id:.40}") as conn:
            row = self._run(conn, _GET_COMMAND, (command_id,)).fetchone()
        return None if row is None else command_from_row(tuple(row))

    def withdraw_rollout_command(self, command_id: str) -> RolloutCommand | None:
        with self._write(f"withdraw rollout command {command_id:.40}") as conn:
            row = self._run(conn, _WITHDRAW_COMMAND, (command_id,)).fetchone()
        return None if row is None else command_from_row(tuple(row))
