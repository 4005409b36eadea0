"""`store_report`: doctor's store row. Which engine, which server, which migrations, OK or BAD.

Read-only on both engines: SQLite's file is read without creating anything beside it
(`common.store.readonly`); PostgreSQL is asked over one short connection. Nothing is created or
migrated. The database is named by `where_of` (host:port/dbname), never with its user or password.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from common.store.db import DB_FILENAME
from common.store.dialect import Migration, newer_than_known
from common.store.errors import failure_line
from common.store.health import check_store
from common.store.readonly import known_versions, reading

CONNECT_TIMEOUT_S = 10


@dataclass(frozen=True)
class StoreReport:
    ok: bool
    detail: str


def applied(found: Mapping[str, int], migrations: Iterable[Migration]) -> str:
    """`migrations applied: listener 9, runs 3, voice 2`, and what the next start adds, if anything."""
    known = known_versions(migrations)
    if not found:
        return "no migrations applied yet (the first run, listen or talk makes the tables)"
    line = "migrations applied: " + ", ".join(f"{p} {v}" for p, v in sorted(found.items()))
    behind = [f"{p} to {v}" for p, v in sorted(known.items()) if found.get(p, 0) < v]
    return line + (f"; the next run, listen or talk upgrades {', '.join(behind)}" if behind else "")


def store_report(home: Path, migrations: Iterable[Migration], *, database_url: str | None = None) -> StoreReport:
    """The store row: SQLite in `home`, or the PostgreSQL database `database_url` names."""
    migrations = list(migrations)
    if database_url:
        return _postgresql(database_url, migrations)
    if problem := check_store(home, migrations):
        return StoreReport(False, problem)
    path = Path(home).expanduser() / DB_FILENAME
    engine = f"SQLite {sqlite3.sqlite_version}"
    if not path.exists():
        return StoreReport(True, f"{engine}, {path} is created on first use")
    with reading(path) as db:
        found = dict(db.execute("SELECT package, MAX(version) FROM schema_migrations GROUP BY package").fetchall()
                     ) if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'schema_migrations'").fetchone() else {}
    return StoreReport(True, f"{engine}, {path}; {applied(found, migrations)}")


def _postgresql(url: str, migrations: list[Migration]) -> StoreReport:
    import psycopg

    from common.store.postgres import where_of

    where = where_of(url)
    try:
        with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True) as conn:
            server = conn.execute("SHOW server_version").fetchone()[0].split()[0]
            found = dict(conn.execute("SELECT package, MAX(version) FROM schema_migrations GROUP BY package"
                                      ).fetchall()) if conn.execute("SELECT to_regclass('schema_migrations')"
                                                                    ).fetchone()[0] else {}
    except psycopg.Error as exc:
        return StoreReport(False, f"cannot use {where} (SWITCHBOARD_DATABASE_URL): {failure_line(exc, url)}")
    known = known_versions(migrations)
    for package, version in sorted(found.items()):
        if package in known and version > known[package]:
            return StoreReport(False, str(newer_than_known(where, package, version, known[package])))
    return StoreReport(True, f"PostgreSQL {server}, {where.removeprefix('PostgreSQL ')}; {applied(found, migrations)}")


class _PostgresReads:
    """A read-only PostgreSQL connection that takes the SQL both engines speak (`?` placeholders), for
    the plain synchronous reads the domains offer doctor. Its errors come out as
    `sqlite3.OperationalError`, so those reads treat "no such table yet" alike on both engines."""

    def __init__(self, conn) -> None:
        self._conn = conn

    def execute(self, sql: str, params=()):
        import psycopg

        from common.store.dialect import postgresql_sql

        try:
            return self._conn.execute(postgresql_sql(sql), params or None)
        except psycopg.Error as exc:
            raise sqlite3.OperationalError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None


@contextlib.contextmanager
def reading_store(home: Path, *, database_url: str | None = None) -> Iterator[object | None]:
    """A synchronous, read-only connection to the store, for doctor's rows that read it (`execute(sql,
    params)` with `?` placeholders, rows indexable by position): the SQLite file, opened without
    writing anything beside it, or the PostgreSQL database in a read-only session. None when there is
    nothing to read (no file yet, or a database that cannot be reached: the store row says why)."""
    if not database_url:
        path = Path(home).expanduser() / DB_FILENAME
        if not path.exists():
            yield None
            return
        with reading(path) as db:
            yield db
        return
    import psycopg

    try:
        conn = psycopg.connect(database_url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True)
        conn.execute("SET default_transaction_read_only = on")  # not `options=`: that would replace the URL's
    except psycopg.Error:
        yield None
        return
    with conn:
        yield _PostgresReads(conn)
