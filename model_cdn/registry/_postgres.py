"""The PostgreSQL registry: for several CDN servers and publishers sharing one database.

Concurrency: ``add_version`` runs in one transaction that first makes sure
the model's row in ``models`` exists, then locks it (``SELECT … FOR UPDATE``)
before comparing the new version with the high-water mark. Two publishers of
the same model therefore take turns; the second one reads the first one's
committed mark and gets ``VersionConflictError``. The primary key on
``versions (name, version)`` backs this up: a unique violation is reported
as the same conflict. A fenced write reads the lease ``FOR SHARE``, so a
server taking the lease over waits for it to commit; the lease's clock is
the database's, so the replicas' clocks do not have to agree.

Connections: a small pool of psycopg 3 connections in autocommit mode, one
per concurrent caller (the HTTP server calls from a thread pool); writes open
an explicit transaction. A connection that broke (server restart) is dropped
and replaced on the next call. Credentials never appear in error messages.

The statements and the ``Registry`` methods are ``_sql``'s, shared with
SQLite. A batch of devices goes in one ``executemany`` (psycopg pipelines
it: one round trip per batch, not per row), in id order so that two
overlapping batches lock rows in the same order and never deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from .._errors import RegistryError
from ._sql import Dialect, SqlRegistry

__all__ = ["PostgresRegistry"]

# Serialises concurrent CREATE TABLE IF NOT EXISTS (which can race on the catalog).
_SCHEMA_LOCK_ID = 0x7A4D_C0DE
_MAX_IDLE = 8  # pooled connections kept open between calls
_CONNECT_TIMEOUT_S = 10


def _where(url: str) -> str:
    """``host:port/dbname`` of a connection URL, without user or password."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "PostgreSQL (unparsable URL)"
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


class PostgresRegistry(SqlRegistry):
    """A registry in a PostgreSQL database (``postgresql://user@host:5432/db``).

    The tables are created when missing. To keep them in their own schema, add
    ``options=-csearch_path%3Dmyschema`` to the URL's query.
    """

    dialect = Dialect(
        integer="BIGINT",
        real="DOUBLE PRECISION",
        least="LEAST",
        for_update="FOR UPDATE",
        for_share="FOR SHARE",
        clock="EXTRACT(EPOCH FROM clock_timestamp())::DOUBLE PRECISION",
        pyformat=True,
    )

    def __init__(self, url: str) -> None:
        self._url = url
        self.where = _where(url)
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._closed = False
        with self._write("create the tables") as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_ID,))
            self._create_tables(conn)

    def _unique_violation(self, error: BaseException | None) -> bool:
        return isinstance(error, pg_errors.UniqueViolation)

    # -- connections -------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self._url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S)
        except psycopg.Error as e:
            # The message of a failed connect names host and user, never the password.
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RegistryError(f"cannot connect to PostgreSQL at {self.where}: {first}") from e

    @contextmanager
    def _read(self, action: str) -> Iterator[psycopg.Connection[Any]]:
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
    def _write(self, action: str) -> Iterator[psycopg.Connection[Any]]:
        with self._read(action) as conn, conn.transaction():
            yield conn

    def _release(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            keep = not (self._closed or conn.closed or conn.broken) and len(self._idle) < _MAX_IDLE
            if keep:
                self._idle.append(conn)
        if not keep:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __repr__(self) -> str:
        return f"PostgresRegistry({self.where!r})"
