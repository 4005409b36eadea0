"""Open the shared database owner-only, in WAL mode, and apply each package's migrations once.

Each package declares its own `Migration(package, version, sql)` list next to its repository module
and passes it in when the store is opened; versions are applied in order, each in one transaction
together with its row in `schema_migrations`, so a crash leaves either all of a migration or none.
Two processes opening the same file at once are safe: the version check runs inside the write lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sqlite3
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiosqlite

DB_FILENAME = "switchboard.db"
_SIDECARS = ("-wal", "-shm", "-journal")
_PACKAGE = re.compile(r"^[a-z][a-z0-9_.]{0,63}$")

_BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    package    TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    applied_at REAL    NOT NULL,
    PRIMARY KEY (package, version)
)
"""


class StoreError(RuntimeError):
    """The database cannot be opened or used; the message says which file and what to do."""


class MigrationError(StoreError):
    """A package's migration list is malformed, or the database is newer than this code."""


@dataclass(frozen=True)
class Migration:
    """One schema step of one package. `version` counts from 1 per package, without gaps."""

    package: str
    version: int
    sql: str


def _check(migrations: Iterable[Migration]) -> dict[str, list[Migration]]:
    by_package: dict[str, list[Migration]] = {}
    for m in migrations:
        if not _PACKAGE.match(m.package):
            raise MigrationError(f"migration package name {m.package!r} is not a lowercase identifier")
        by_package.setdefault(m.package, []).append(m)
    for package, items in by_package.items():
        items.sort(key=lambda m: m.version)
        versions = [m.version for m in items]
        if versions != list(range(1, len(items) + 1)):
            raise MigrationError(f"migrations of {package!r} must be numbered 1..n without gaps or "
                                 f"repeats, got {versions}")
    return by_package


def split_statements(sql: str) -> list[str]:
    """Split a migration script into complete statements (triggers included), dropping blanks."""
    statements, buffer = [], ""
    for piece in sql.split(";"):
        buffer += piece + ";"
        if sqlite3.complete_statement(buffer):
            if buffer.strip(" \t\r\n;"):
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip(" \t\r\n;"):
        raise MigrationError(f"migration has an incomplete statement: {buffer.strip()[:80]!r}")
    return statements


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


class Store:
    """One aiosqlite connection in autocommit mode; multi-statement writes go through `transaction()`."""

    def __init__(self, path: Path, db: aiosqlite.Connection, clock: Callable[[], float]) -> None:
        self.path = path
        self.db = db
        self._clock = clock
        self._write_lock = asyncio.Lock()

    @property
    def files(self) -> tuple[Path, ...]:
        """The database file and whichever sidecars exist right now."""
        sidecars = (self.path.with_name(self.path.name + s) for s in _SIDECARS)
        return (self.path, *(p for p in sidecars if p.exists()))

    def tighten_modes(self) -> None:
        """Re-assert 0600 on the database and its sidecars (SQLite may recreate -wal/-shm)."""
        for path in self.files:
            _tighten(path)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """BEGIN IMMEDIATE … COMMIT (ROLLBACK on error), one writer of this process at a time."""
        async with self._write_lock:
            await self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.db.execute("ROLLBACK")
                raise
            await self.db.execute("COMMIT")

    async def execute(self, sql: str, params: Sequence = ()) -> int:
        """One statement, committed at once; returns the number of rows changed."""
        async with self._write_lock:
            cursor = await self.db.execute(sql, params)
            return cursor.rowcount

    async def insert(self, sql: str, params: Sequence = ()) -> int:
        """One INSERT, committed at once; returns the new row id."""
        async with self._write_lock:
            cursor = await self.db.execute(sql, params)
            return int(cursor.lastrowid)

    async def fetchone(self, sql: str, params: Sequence = ()) -> sqlite3.Row | None:
        async with self.db.execute(sql, params) as cursor:
            return await cursor.fetchone()

    async def fetchall(self, sql: str, params: Sequence = ()) -> list[sqlite3.Row]:
        async with self.db.execute(sql, params) as cursor:
            return list(await cursor.fetchall())

    async def versions(self) -> dict[str, int]:
        """The highest applied version of every package."""
        rows = await self.fetchall("SELECT package, MAX(version) AS v FROM schema_migrations GROUP BY package")
        return {row["package"]: row["v"] for row in rows}

    async def migrate(self, migrations: Iterable[Migration]) -> list[Migration]:
        """Apply the migrations not yet recorded; returns those applied now. Safe to call again."""
        applied: list[Migration] = []
        for package, items in _check(migrations).items():
            async with self.transaction() as db:
                async with db.execute("SELECT MAX(version) FROM schema_migrations WHERE package = ?",
                                      (package,)) as cursor:
                    current = (await cursor.fetchone())[0] or 0
                if current > len(items):
                    raise MigrationError(f"{self.path} has {package} schema version {current}, newer than "
                                         f"this Switchboard knows ({len(items)}); upgrade Switchboard")
                for migration in items[current:]:
                    for statement in split_statements(migration.sql):
                        await db.execute(statement)
                    await db.execute("INSERT INTO schema_migrations (package, version, applied_at) "
                                     "VALUES (?, ?, ?)", (package, migration.version, self._clock()))
                    applied.append(migration)
        self.tighten_modes()
        return applied

    async def close(self) -> None:
        await self.db.close()


async def _enter_wal(db: aiosqlite.Connection, attempts: int = 100) -> str:
    """PRAGMA journal_mode=WAL, retried: SQLite answers a concurrent switch with SQLITE_BUSY at once,
    without calling the busy handler, when two processes create the database together."""
    for attempt in range(attempts):
        try:
            return str((await (await db.execute("PRAGMA journal_mode=WAL")).fetchone())[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == attempts - 1:
                raise
            await asyncio.sleep(0.01)
    raise AssertionError("unreachable")  # pragma: no cover


async def open_store(home: Path, migrations: Iterable[Migration] = (), *,
                     clock: Callable[[], float] = time.time, filename: str = DB_FILENAME) -> Store:
    """Open (creating) `home/filename` owner-only in WAL mode and apply `migrations`."""
    home = Path(home).expanduser()
    path = home / filename
    from bot.paths import home_problem  # the same line doctor prints

    if problem := home_problem(home):
        raise StoreError(problem)
    try:
        _secure_dir(home)
        _secure_file(path)
        db = await aiosqlite.connect(path, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot open the database {path}: {exc}; check SWITCHBOARD_HOME and its "
                         f"permissions") from None
    db.row_factory = sqlite3.Row
    store = Store(path, db, clock)
    try:
        # First: switching to WAL takes the write lock, and another process may be opening it too.
        await db.execute("PRAGMA busy_timeout=5000")
        mode = await _enter_wal(db)
        if str(mode).lower() != "wal":
            raise StoreError(f"{path} could not switch to WAL mode (got {mode}); is it on a network "
                             f"filesystem?")
        await db.execute("PRAGMA foreign_keys=ON")
        await db.execute("PRAGMA synchronous=FULL")
        await db.execute(_BOOTSTRAP)
        await store.migrate(migrations)
    except BaseException:
        await db.close()
        raise
    return store
