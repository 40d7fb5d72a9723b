"""The SQLite registry: the default, one file, no server.

Concurrency: WAL journal (readers never block the writer), one connection
per thread (``sqlite3`` connections are not for sharing), and every write in
a ``BEGIN IMMEDIATE`` transaction, which takes the database's write lock
before the first read. So ``add_version``'s "above the latest?" check and
its insert see the same state even with several publishers in several
processes: the second one waits for the lock (``busy_timeout``) and then
sees the first one's version. For the same reason the SQL needs no row
locks, and the lease's clock is this host's (one file, one host).

The statements and the ``Registry`` methods are ``_sql``'s, shared with
PostgreSQL; the tables are created when missing, so a file from before the
fleet tables existed gains them when it is opened.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .._errors import RegistryError
from ._sql import Dialect, SqlRegistry

__all__ = ["SqliteRegistry"]

_BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another's transaction


class SqliteRegistry(SqlRegistry):
    """A registry in one SQLite file (created, with its tables, when missing).

    ``create=False`` refuses a missing file instead, so that a read-only
    command with a mistyped path does not leave an empty registry behind.
    """

    dialect = Dialect(
        integer="INTEGER", real="REAL", least="min", for_update="", for_share="", clock=None
    )

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
        # Statement by statement, each its own transaction: a file whose tables all exist
        # is only read, so opening it neither needs nor waits for the write lock.
        with self._read("create the tables") as conn:
            self._create_tables(conn)

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
    def _read(self, action: str) -> Iterator[sqlite3.Connection]:
        with self._errors(action):
            yield self._connection()

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

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"SqliteRegistry({str(self.path)!r})"
