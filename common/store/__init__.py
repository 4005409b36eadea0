"""The shared store: every package's tables in one database, on one of two engines.

- **SQLite** (the default): one file in SWITCHBOARD_HOME, shared by the processes of one host
  (`common.store.db`).
- **PostgreSQL** (`SWITCHBOARD_DATABASE_URL`, `postgresql://` or `postgres://`): one database shared
  by every process of every host (`common.store.postgres`).

The API, the same on both engines:

    store = await open_store(home, migrations, database_url=None, create=True, clock=time.time, busy=None)
    store.engine                      # "sqlite" | "postgresql"
    store.where                       # the database as a line may name it (a path; host:port/db, no password)
    await store.versions()            # {package: highest applied migration}
    await store.now()                 # the clock two hosts compare: the server's on PostgreSQL
    await store.sessions()            # processes connected to a shared server (None on SQLite)
    await store.server_version()      # "SQLite 3.46.1" | "PostgreSQL 15.8"
    await store.execute(sql, params)  # one statement, committed; rows changed
    await store.insert(sql, params)   # one INSERT into a table keyed by `id`, committed; the new id
    await store.fetchone(sql, params) / store.fetchall(sql, params)
    await store.transact(body)        # body(tx) in one write transaction, run again after a retryable
                                      # failure (connection lost, serialization, deadlock); its result
    async with store.transaction() as tx: ...   # one attempt (its start is retried)
    await store.close()

`tx` (`common.store.base.Tx`) has `execute`, `executemany`, `insert`, `fetchone`, `fetchall` and
`engine`. Rows answer `row["column"]` and `row[0]`. SQL is written once with `?` placeholders, in
what both engines speak; write transactions run one at a time across processes (and hosts) on both
engines, so a read-decide-write inside one is atomic. What differs between the engines — DDL types,
placeholders, `IS ?`, full-text search, the error classes — is in `common.store.dialect` and the
engine modules, nowhere else. Errors the user can act on are `StoreError` (one line, says what to do).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from common.store.base import Busy, Retry, Store, Tx, process_session
from common.store.db import DB_FILENAME, SqliteStore, open_sqlite
from common.store.dialect import ENGINES, POSTGRESQL, SQLITE, Migration, Search, index_new_rows, search
from common.store.errors import MigrationError, StoreError
from common.store.health import check_store

DATABASE_URL_SCHEMES = ("postgresql://", "postgres://")

__all__ = ["DATABASE_URL_SCHEMES", "DB_FILENAME", "ENGINES", "POSTGRESQL", "SQLITE", "Busy", "Migration",
           "MigrationError", "Retry", "Search", "SqliteStore", "Store", "StoreError", "Tx", "check_store",
           "index_new_rows", "open_store", "process_session", "search"]


async def open_store(home: Path, migrations: Iterable[Migration] = (), *, database_url: str | None = None,
                     create: bool = True, clock: Callable[[], float] = time.time, filename: str = DB_FILENAME,
                     busy: Busy | None = None, read_only: bool = False) -> Store:
    """The store: in PostgreSQL when `database_url` is given, else SQLite's `home/filename`; tables
    made (unless `create` is false and there is no store yet: StoreError) and `migrations` applied.
    Raises StoreError (one line) when the store cannot be opened or used; deletes nothing. `read_only`
    (a command that only reads): SQLite's file is read without writing anything beside it, in a home
    this process may not be able to write (`common.store.readonly`)."""
    if database_url:
        if not database_url.startswith(DATABASE_URL_SCHEMES):
            scheme = database_url.split("://", 1)[0] if "://" in database_url else "no scheme"
            raise StoreError(f"SWITCHBOARD_DATABASE_URL must start with postgresql:// or postgres:// (got {scheme}); "
                             "unset it to keep the store in SWITCHBOARD_HOME")
        from common.store.postgres import open_postgres  # psycopg is loaded only for PostgreSQL

        return await open_postgres(database_url, migrations, clock=clock, busy=busy, create=create)
    return await open_sqlite(home, migrations, clock=clock, filename=filename, busy=busy, create=create,
                             read_only=read_only)
