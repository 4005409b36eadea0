"""The SQLite engine: the shared database file, owner-only, in WAL mode, each package's migrations once.

Many processes share this file (`run`, `listen`, the CLI, an agent run changing callbacks), so each
process opens two connections and never mixes their jobs:

- the **writer** runs only `BEGIN IMMEDIATE … COMMIT` transactions and single-statement writes, one
  at a time in this process. It never holds a read open between them, so taking the write lock
  always goes through SQLite's busy wait. (A write on a connection that still holds an older read
  snapshot is refused at once, SQLITE_BUSY_SNAPSHOT, which no busy timeout covers.)
- the **reader** runs every `fetchone`/`fetchall` as its own short statement (WAL: it never blocks
  and is never blocked by a writer) and sees every commit made before it started.

A write that still finds the database locked after the busy wait is tried again a few times after a
jittered pause, then fails with a `StoreError` that says what to do. So does a file that is not a
usable database: nothing is ever deleted or recreated for the user.

Each package declares its own `Migration(package, version, sql)` list (`common.store.dialect`) next to its repository module
and passes it in when the store is opened; versions are applied in order, each in one transaction
together with its row in `schema_migrations`, so a crash leaves either all of a migration or none.
Two processes opening the same file at once are safe: the version check runs inside the write lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import stat
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

import aiosqlite

from common.store.base import Busy, Store
from common.store.dialect import SQLITE, Migration
from common.store.errors import StoreError, is_busy, store_problem

DB_FILENAME = "switchboard.db"
_SIDECARS = ("-wal", "-shm", "-journal")
T = TypeVar("T")

_BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    package    TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    applied_at REAL    NOT NULL,
    PRIMARY KEY (package, version)
)
"""


def _secure_dir(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stat.S_IMODE(directory.stat().st_mode) != 0o700:
        os.chmod(directory, 0o700)


def _secure_file(path: Path) -> None:
    # Create it owner-only before SQLite does: SQLite gives the -wal/-shm sidecars the db's mode.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    _tighten(path)


def _tighten(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_IMODE(path.stat().st_mode) != 0o600:
            os.chmod(path, 0o600)


class SqliteTx:
    """A transaction on the writer (`common.store.base.Tx`)."""

    engine = SQLITE

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    async def execute(self, sql: str, params: Sequence = ()) -> int:
        async with self._conn.execute(sql, params) as cursor:
            return cursor.rowcount

    async def executemany(self, sql: str, rows: Iterable[Sequence]) -> None:
        await self._conn.executemany(sql, rows)

    async def insert(self, sql: str, params: Sequence = ()) -> int:
        async with self._conn.execute(sql, params) as cursor:
            return int(cursor.lastrowid)

    async def fetchone(self, sql: str, params: Sequence = ()) -> sqlite3.Row | None:
        async with self._conn.execute(sql, params) as cursor:
            return await cursor.fetchone()

    async def fetchall(self, sql: str, params: Sequence = ()) -> list[sqlite3.Row]:
        async with self._conn.execute(sql, params) as cursor:
            return list(await cursor.fetchall())


class SqliteStore(Store):
    """The shared database file: a writer connection for transactions and single-statement writes, a
    reader connection for queries (see the module docstring). Methods raise `StoreError` (one line,
    names the file, says what to do) when the file is damaged or stays locked."""

    engine = SQLITE

    def __init__(self, path: Path, writer: aiosqlite.Connection, reader: aiosqlite.Connection,
                 clock: Callable[[], float], busy: Busy) -> None:
        self.path = path
        self.where = str(path)
        self.db = writer  # the writer: only inside `transaction()`, or one autocommit statement
        self.reader = reader
        self._clock = clock
        self._busy = busy
        self._write_lock = asyncio.Lock()
        self._closed = False
        self.read_only = False  # opened by a command that only reads (`common.store.readonly`)

    @property
    def files(self) -> tuple[Path, ...]:
        """The database file and whichever sidecars exist right now."""
        sidecars = (self.path.with_name(self.path.name + s) for s in _SIDECARS)
        return (self.path, *(p for p in sidecars if p.exists()))

    def tighten_modes(self) -> None:
        """Re-assert 0600 on the database and its sidecars (SQLite may recreate -wal/-shm)."""
        for path in self.files:
            _tighten(path)

    async def _retry(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run `operation`, again after a jittered pause while the database stays locked; a damaged
        file or a lock that outlasts every attempt becomes one StoreError line."""
        for attempt in range(self._busy.attempts):
            try:
                return await operation()
            except sqlite3.Error as exc:
                if not is_busy(exc) or attempt == self._busy.attempts - 1:
                    raise self._problem(exc) from None
            await self._busy.sleep(self._busy.pause(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def _problem(self, exc: sqlite3.Error) -> Exception:
        if is_busy(exc):
            waited = self._busy.timeout_s * self._busy.attempts
            return StoreError(f"{self.path} stayed locked by another process for over {waited:.0f} s: try again; "
                              "if it persists, stop the other Switchboard processes using this SWITCHBOARD_HOME")
        problem = store_problem(self.path, exc)
        return StoreError(problem) if problem else exc

    async def server_version(self) -> str:
        """SQLite's library version, e.g. "SQLite 3.46.1"."""
        return f"SQLite {sqlite3.sqlite_version}"

    async def _on_retry(self, exc, attempt: int) -> None:  # SQLite's waits are inside `_retry`
        raise exc

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[SqliteTx]:
        """BEGIN IMMEDIATE … COMMIT (ROLLBACK on error) on the writer, one transaction of this
        process at a time. Everything read through the yielded connection is read under the write
        lock, so a read-then-write inside it is atomic across processes. Keep it short: no network,
        no model calls inside."""
        async with self._write_lock:
            try:
                # Inside the try: a task cancelled while its BEGIN waits on the writer's thread still
                # begins, and must still be rolled back.
                await self._retry(lambda: self.db.execute("BEGIN IMMEDIATE"))
                yield SqliteTx(self.db)
                await self.db.execute("COMMIT")
            except BaseException as exc:
                # Queued at once on the writer's thread, so it runs even if this task is cancelled
                # again: a transaction left open would hold every other process's writes.
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._rollback())
                if isinstance(exc, sqlite3.Error):
                    raise self._problem(exc) from None
                raise

    async def _rollback(self) -> None:
        # Unconditionally, queued behind whatever this connection was asked before (a BEGIN still
        # waiting on the writer's thread included): `in_transaction`, read here on the loop, could
        # say no for a BEGIN that has not run yet. With no transaction open, SQLite refuses; fine.
        with contextlib.suppress(sqlite3.OperationalError):
            await self.db.execute("ROLLBACK")

    async def execute(self, sql: str, params: Sequence = ()) -> int:
        """One statement, committed at once; returns the number of rows changed."""
        async def run() -> int:
            async with self.db.execute(sql, params) as cursor:
                return cursor.rowcount

        async with self._write_lock:
            return await self._retry(run)

    async def insert(self, sql: str, params: Sequence = ()) -> int:
        """One INSERT, committed at once; returns the new row id."""
        async def run() -> int:
            async with self.db.execute(sql, params) as cursor:
                return int(cursor.lastrowid)

        async with self._write_lock:
            return await self._retry(run)

    async def fetchone(self, sql: str, params: Sequence = ()) -> sqlite3.Row | None:
        return await self._retry(lambda: self._read(_first, sql, params))

    async def fetchall(self, sql: str, params: Sequence = ()) -> list[sqlite3.Row]:
        return await self._retry(lambda: self._read(_every, sql, params))

    async def _read(self, read: Callable[[sqlite3.Connection, str, Sequence], T], sql: str, params: Sequence) -> T:
        # One call on the reader's thread: the statement runs, is read and is closed before any other
        # task's read runs there. A statement left open between awaits would keep the reader's snapshot
        # open, and every other task's read would see the database as it was then, missing later commits.
        return await self.reader._execute(read, self.reader._conn, sql, params)

    async def migrate(self, migrations: Iterable[Migration]) -> list[Migration]:
        if self.read_only:  # checked when it was opened; a reading command never upgrades the schema
            return []
        applied = await super().migrate(migrations)
        self.tighten_modes()
        return applied

    async def close(self) -> None:
        """Close both connections; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        for connection in (self.reader, self.db):
            with contextlib.suppress(Exception):
                await connection.close()


def _first(conn: sqlite3.Connection, sql: str, params: Sequence) -> sqlite3.Row | None:
    cursor = conn.execute(sql, params)
    try:
        return cursor.fetchone()
    finally:
        cursor.close()


def _every(conn: sqlite3.Connection, sql: str, params: Sequence) -> list[sqlite3.Row]:
    cursor = conn.execute(sql, params)
    try:
        return cursor.fetchall()
    finally:
        cursor.close()


async def _connect(path: Path | str, busy: Busy) -> aiosqlite.Connection:
    """An aiosqlite connection whose worker thread is a daemon: a store left open (a test that
    failed, a crash on the way out) must not keep the interpreter alive waiting for it at exit. A
    `file:` URI string opens with its parameters (`common.store.readonly`)."""
    connection = aiosqlite.connect(path, isolation_level=None, timeout=busy.timeout_s,
                                   uri=isinstance(path, str) and path.startswith("file:"))
    worker = getattr(connection, "_thread", None)  # aiosqlite starts it on first await, non-daemon
    if isinstance(worker, threading.Thread) and not worker.is_alive():
        worker.daemon = True
    db = await connection
    db.row_factory = sqlite3.Row
    return db


async def _enter_wal(store: SqliteStore) -> str:
    """PRAGMA journal_mode=WAL, retried: SQLite answers a concurrent switch with SQLITE_BUSY at once,
    without calling the busy handler, when two processes create the database together."""
    async def switch() -> str:
        async with store.db.execute("PRAGMA journal_mode=WAL") as cursor:
            return str((await cursor.fetchone())[0])

    async with store._write_lock:
        return await store._retry(switch)


async def open_sqlite(home: Path, migrations: Iterable[Migration] = (), *,
                      clock: Callable[[], float] = time.time, filename: str = DB_FILENAME,
                      busy: Busy | None = None, create: bool = True, read_only: bool = False) -> SqliteStore:
    """Open (creating, unless `create` is false) `home/filename` owner-only in WAL mode and apply
    `migrations`. Raises StoreError (one line) for a home or file that cannot hold the store, or that
    holds none when `create` is false (a command that only reads: a mistyped SWITCHBOARD_HOME must not
    quietly become a new, empty store); deletes nothing. `read_only` (implies `create=False`): only
    read, creating nothing beside the file, in a home this process may not be able to write
    (`common.store.readonly`)."""
    home = Path(home).expanduser()
    path = home / filename
    busy = busy or Busy()
    from common.paths import home_problem  # the same line doctor prints

    if problem := home_problem(home, writing=not read_only):
        raise StoreError(problem)
    if (read_only or not create) and not path.exists():
        raise StoreError(f"there is no store in {home}: nothing has been recorded there yet; check "
                         "SWITCHBOARD_HOME (switchboard run, listen and talk create it)")
    if problem := store_problem(path):
        raise StoreError(problem)
    if read_only:
        from common.store.readonly import open_read_only

        async def reading(uri: str) -> Store:
            connection = await _connect(uri, busy)
            return SqliteStore(path, connection, connection, clock, busy)

        try:
            if (store := await open_read_only(path, migrations, reading)) is not None:
                return store
        except sqlite3.Error as exc:
            raise StoreError(store_problem(path, exc) or f"cannot read {path}: {exc}; check SWITCHBOARD_HOME "
                             "and its permissions") from None
    try:
        _secure_dir(home)
        _secure_file(path)
        writer = await _connect(path, busy)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(store_problem(path, exc) or f"cannot open the database {path}: {exc}; check "
                         f"SWITCHBOARD_HOME and its permissions") from None
    try:
        reader = await _connect(path, busy)
    except BaseException:
        await writer.close()
        raise
    store = SqliteStore(path, writer, reader, clock, busy)
    try:
        # First: switching to WAL takes the write lock, and another process may be opening it too.
        mode = await _enter_wal(store)
        if mode.lower() != "wal":
            raise StoreError(f"{path} could not switch to WAL mode (got {mode}); is it on a network "
                             f"filesystem? Keep SWITCHBOARD_HOME on a local disk")
        await store.execute("PRAGMA foreign_keys=ON")
        await store.execute("PRAGMA synchronous=FULL")
        await store.execute(_BOOTSTRAP)
        await store.migrate(migrations)
        # The reader only reads: a write sent to it by mistake fails loudly instead of racing the writer.
        await store._retry(lambda: reader.execute("PRAGMA query_only=ON"))
        await store.fetchone("SELECT COUNT(*) FROM sqlite_master")
    except BaseException:
        await store.close()
        raise
    return store
