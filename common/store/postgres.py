"""The PostgreSQL engine: the same store over a database every host reaches (`SWITCHBOARD_DATABASE_URL`).

Driver: psycopg 3 (async) with psycopg_pool. Each connection is in autocommit mode with
`prepare_threshold=None` (no server-side prepared statements: PgBouncer in transaction mode hands a
session's statements to other backends), and is checked before it is handed out, so a connection
killed by a server restart is replaced instead of failing the next query.

- **Writes keep SQLite's guarantee.** Every `transaction()` first takes one transaction-scoped
  advisory lock (`WRITE_LOCK`), so write transactions run one at a time across every process and
  host, as `BEGIN IMMEDIATE` makes them on SQLite: a read-decide-write inside one is atomic, and two
  of them cannot deadlock. A single statement (`execute`, `insert`) takes no lock: it may decide only
  on the rows it writes (READ COMMITTED re-checks an UPDATE's WHERE against the row it waited for, so
  a compare-and-set has one winner); one whose subquery reads other rows would read them as they
  were when it began, missing a transaction committing meanwhile, so such a write is a transaction.
  Reads take no lock and see every commit made before they start, as SQLite's reader does.
- **Failures worth another try** (`is_retryable`: the connection lost, the server shutting down or
  starting, a serialization failure, a deadlock) are retried with a jittered exponential pause for
  up to `Busy.lost_s`: a single statement or a whole `transact()` body again; `transaction()` retries
  only its start and raises `Retry` from inside. The first loss logs one warning line, the
  reconnection one more; no traceback. What did not commit is not acknowledged by the caller.
- **Migrations** are applied under a session advisory lock (`MIGRATE_LOCK`), with the search
  configuration (`dialect.POSTGRESQL_BOOTSTRAP`: unaccent + 'simple'), so processes starting at once
  do not race.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict

from common.process import this_process
from common.store.base import Busy, Retry, Store, process_session
from common.store.dialect import POSTGRESQL, POSTGRESQL_BOOTSTRAP, Migration, postgresql_sql
from common.store.errors import StoreError, failure_line

T = TypeVar("T")
log = logging.getLogger("switchboard.store")
# The pool logs each connection it drops or fails to remake; the store says once what happened instead.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
# Advisory lock keys (class, the store's schema): a store is the tables of one schema, and two stores in
# one database (two schemas) never wait for each other.
WRITE_LOCK = "SELECT pg_advisory_xact_lock(53574201, hashtext(current_schema()))"  # one write transaction at a time
MIGRATE_LOCK = 53574202  # with the schema's hash: one process applies migrations at a time
SCHEMES = ("postgresql://", "postgres://")
POOL_SIZE = 8
CONNECT_TIMEOUT_S = 10


class Row(tuple):
    """A result row that answers `row["column"]` and `row[0]`, as sqlite3.Row does (`_names`: the
    column positions, one class per result shape)."""

    __slots__ = ()
    _names: dict[str, int] = {}

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


@lru_cache(maxsize=512)
def _row_class(names: tuple[str, ...]) -> type[Row]:
    positions = {name: i for i, name in reversed(list(enumerate(names)))}  # the first of a repeated name
    return type("Row", (Row,), {"__slots__": (), "_names": positions})


def _rows(cursor: psycopg.AsyncCursor[Any]) -> Callable[[Sequence[Any]], Row]:
    return _row_class(tuple(column.name for column in cursor.description or ()))


def is_connection_lost(exc: BaseException) -> bool:
    """The connection is gone or the server is restarting: reconnecting and trying again helps."""
    if isinstance(exc, (psycopg_pool.PoolTimeout, psycopg.InterfaceError)):
        return True
    if isinstance(exc, (pg_errors.AdminShutdown, pg_errors.CrashShutdown, pg_errors.CannotConnectNow,
                        pg_errors.ConnectionException)):
        return True
    # A broken socket carries no SQLSTATE; a server error always does.
    return isinstance(exc, psycopg.OperationalError) and getattr(exc, "sqlstate", None) is None


def is_retryable(exc: BaseException) -> bool:
    """Worth running again: the connection is lost, or the server chose this transaction to fail
    (serialization failure, deadlock)."""
    return is_connection_lost(exc) or isinstance(exc, (pg_errors.SerializationFailure, pg_errors.DeadlockDetected))


def where_of(url: str) -> str:
    """The database a URL names, as a line may show it: host:port/dbname, never a user or password."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.Error:
        return "PostgreSQL (a URL its driver cannot read)"
    host = info.get("host") or "localhost"
    port = info.get("port") or "5432"
    return f"PostgreSQL {host}:{port}/{info.get('dbname') or info.get('user') or ''}".rstrip("/")


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(text[0].split())[:200] if text else type(exc).__name__


_COPYABLE = re.compile(r"INSERT INTO (?P<table>\w+) \((?P<columns>[\w ,]+)\) VALUES \((?:\?, )*\?\)", re.IGNORECASE)


class PostgresTx:
    """A transaction on one pooled connection (`common.store.base.Tx`)."""

    engine = POSTGRESQL

    def __init__(self, conn: psycopg.AsyncConnection) -> None:
        self._conn = conn

    async def execute(self, sql: str, params: Sequence = ()) -> int:
        # Without parameters psycopg reads no placeholders: the text goes as written (DDL, DO blocks).
        cursor = await self._conn.execute(postgresql_sql(sql) if params else sql, params or None)
        return cursor.rowcount

    async def executemany(self, sql: str, rows: Iterable[Sequence]) -> None:
        """Many rows: a plain `INSERT INTO t (columns) VALUES (?, …)` goes in by COPY (several times
        faster: one stream instead of a statement per row); anything else statement by statement."""
        if copy := _COPYABLE.fullmatch(sql.strip()):
            async with self._conn.cursor() as cursor:
                async with cursor.copy(f"COPY {copy['table']} ({copy['columns']}) FROM STDIN") as stream:
                    for row in rows:
                        await stream.write_row(row)
            return
        async with self._conn.cursor() as cursor:
            await cursor.executemany(postgresql_sql(sql), list(rows))

    async def insert(self, sql: str, params: Sequence = ()) -> int:
        cursor = await self._conn.execute(postgresql_sql(sql) + " RETURNING id", params)
        return int((await cursor.fetchone())[0])

    async def fetchone(self, sql: str, params: Sequence = ()) -> Row | None:
        cursor = await self._conn.execute(postgresql_sql(sql), params)
        return await cursor.fetchone()

    async def fetchall(self, sql: str, params: Sequence = ()) -> list[Row]:
        cursor = await self._conn.execute(postgresql_sql(sql), params)
        return await cursor.fetchall()


class PostgresStore(Store):
    """The store in a PostgreSQL database (see the module docstring). `where` names it without a
    password; methods raise `StoreError` (one line) when the server stays unreachable."""

    engine = POSTGRESQL

    def __init__(self, pool: psycopg_pool.AsyncConnectionPool, where: str, clock: Callable[[], float],
                 busy: Busy) -> None:
        self._pool = pool
        self.where = where
        self.path = None  # no file: `where` names the database
        self._clock = clock
        self._busy = busy
        self._lost_since: float | None = None
        self._closed = False

    async def now(self) -> float:
        """The server's clock, unless a clock was injected (tests on a virtual clock)."""
        if self._clock is not time.time:
            return self._clock()
        row = await self.fetchone("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")
        return float(row[0])

    async def sessions(self) -> frozenset[str]:
        """The application_name of every Switchboard session on the server (`process_session`)."""
        rows = await self.fetchall("SELECT DISTINCT application_name FROM pg_stat_activity "
                                   "WHERE application_name LIKE 'switchboard %'")
        return frozenset(row[0] for row in rows)

    async def server_version(self) -> str:
        """e.g. "PostgreSQL 15.8"."""
        row = await self.fetchone("SELECT current_setting('server_version')")
        return f"PostgreSQL {row[0].split()[0]}"

    # -- connection loss ---------------------------------------------------------------------------

    def _lost(self, exc: BaseException) -> None:
        if self._lost_since is None:
            self._lost_since = time.monotonic()
            log.warning("store: lost the connection to %s (%s); reconnecting and trying again", self.where,
                        _reason(exc))

    async def _check(self, conn: psycopg.AsyncConnection) -> None:
        """The pool's check of a connection before handing it out: a dead one is replaced (the pool
        waits for a new one); the loss is said once here, the return by the next query to succeed."""
        try:
            await psycopg_pool.AsyncConnectionPool.check_connection(conn)
        except Exception as exc:
            self._lost(exc)
            raise

    def _back(self) -> None:
        if self._lost_since is not None:
            log.warning("store: reconnected to %s after %.1f s", self.where, time.monotonic() - self._lost_since)
            self._lost_since = None

    async def _on_retry(self, exc: Retry, attempt: int) -> None:
        cause = exc.__cause__ or exc
        if is_connection_lost(cause):
            self._lost(cause)
        waited = 0.0 if self._lost_since is None else time.monotonic() - self._lost_since
        if attempt >= self._busy.attempts and not is_connection_lost(cause) or waited > self._busy.lost_s:
            raise self._gave_up(cause) from None
        await self._busy.sleep(self._busy.pause(min(attempt - 1, 10)))

    def _gave_up(self, exc: BaseException) -> StoreError:
        if is_connection_lost(exc):
            return StoreError(f"lost the connection to {self.where} for over {self._busy.lost_s:.0f} s "
                              f"({_reason(exc)}): check that the server is up and SWITCHBOARD_DATABASE_URL")
        return StoreError(f"{self.where} kept refusing a transaction ({_reason(exc)}): try again")

    async def _retrying(self, once: Callable[[], Awaitable[T]]) -> T:
        """`once()`, again after a pause while it fails retryably (see `_on_retry`)."""
        attempt = 0
        while True:
            try:
                result = await once()
                self._back()
                return result
            except Exception as exc:
                if not is_retryable(exc):
                    raise
                attempt += 1
                retry = Retry(_reason(exc))
                retry.__cause__ = exc
                await self._on_retry(retry, attempt)

    async def _attempts(self, operation: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        """`operation` on a pooled connection, retried (see `_retrying`)."""
        async def once() -> T:
            async with self._pool.connection() as conn:
                return await operation(conn)

        return await self._retrying(once)

    # -- the store's interface ---------------------------------------------------------------------

    async def execute(self, sql: str, params: Sequence = ()) -> int:
        """One statement, committed at once; returns the number of rows changed. It takes no write lock:
        it may decide only on the rows it writes (READ COMMITTED re-checks those against a concurrent
        commit); a write that reads other rows to decide belongs in a transaction."""
        return await self._attempts(lambda conn: PostgresTx(conn).execute(sql, params))

    async def insert(self, sql: str, params: Sequence = ()) -> int:
        """One INSERT into a table keyed by `id`, committed at once; returns the new id."""
        return await self._attempts(lambda conn: PostgresTx(conn).insert(sql, params))

    async def fetchone(self, sql: str, params: Sequence = ()) -> Row | None:
        return await self._attempts(lambda conn: PostgresTx(conn).fetchone(sql, params))

    async def fetchall(self, sql: str, params: Sequence = ()) -> list[Row]:
        return await self._attempts(lambda conn: PostgresTx(conn).fetchall(sql, params))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[PostgresTx]:
        """BEGIN … COMMIT (ROLLBACK on error) holding the write lock (see the module docstring). Its
        start is retried while the server is unreachable; a retryable failure after that raises
        `Retry` (`transact()` runs the body again; a caller of `transaction()` gets one line)."""
        conn = await self._retrying(self._begin)
        try:
            try:
                yield PostgresTx(conn)
                await conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
                raise
        except Exception as exc:
            if is_retryable(exc):
                raise Retry(f"{self.where}: {_reason(exc)}; the transaction was not committed: try again") from exc
            raise
        finally:
            await self._pool.putconn(conn)

    async def _begin(self) -> psycopg.AsyncConnection:
        conn = await self._pool.getconn()
        try:
            await conn.execute(f"BEGIN; {WRITE_LOCK}")  # one round trip
        except BaseException:
            await self._pool.putconn(conn)
            raise
        return conn

    async def close(self) -> None:
        """Close the pool; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            await self._pool.close()


async def _prepare(conn: psycopg.AsyncConnection, store: PostgresStore, migrations: Iterable[Migration],
                   create: bool) -> None:
    """The search configuration, the migrations table and every migration, under `MIGRATE_LOCK`."""
    await conn.execute("SELECT pg_advisory_lock(%s, hashtext(current_schema()))", (MIGRATE_LOCK,))
    try:
        if not create:
            # In this schema only: a store in another schema on the search path (public) is not this one.
            cursor = await conn.execute("SELECT to_regclass(format('%I.schema_migrations', current_schema())) "
                                        "IS NOT NULL")
            if not (await cursor.fetchone())[0]:
                raise StoreError(f"there is no Switchboard store in {store.where} yet: nothing has been recorded "
                                 "there; check SWITCHBOARD_DATABASE_URL (switchboard run, listen and talk create it)")
        for statement in POSTGRESQL_BOOTSTRAP:
            await conn.execute(statement)
        from common.store.dialect import check_migrations

        for package, items in check_migrations(migrations).items():
            async with conn.transaction():
                await store._migrate_package(PostgresTx(conn), package, items)
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s, hashtext(current_schema()))", (MIGRATE_LOCK,))


async def open_postgres(url: str, migrations: Iterable[Migration] = (), *, clock: Callable[[], float] = time.time,
                        busy: Busy | None = None, create: bool = True) -> PostgresStore:
    """Connect to the database `url` names, make its tables (unless `create` is false and it has no
    store: then StoreError) and apply `migrations` under the migration lock. Raises StoreError (one
    line, never the password) when it cannot be reached or used."""
    where = where_of(url)
    busy = busy or Busy()
    settings: dict[str, Any] = {"autocommit": True, "prepare_threshold": None, "row_factory": _rows,
                                "application_name": process_session(this_process())}
    store: PostgresStore

    async def check(conn: psycopg.AsyncConnection) -> None:
        await store._check(conn)

    pool = psycopg_pool.AsyncConnectionPool(url, min_size=1, max_size=POOL_SIZE, kwargs=settings, open=False,
                                            check=check, name="switchboard-store")
    store = PostgresStore(pool, where, clock, busy)
    try:
        # One direct connection first: a wrong password or database fails here with the server's reason.
        conn = await psycopg.AsyncConnection.connect(url, connect_timeout=CONNECT_TIMEOUT_S, **settings)
        try:
            await _prepare(conn, store, migrations, create)
        finally:
            await conn.close()
        await pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
    except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
        await store.close()
        raise StoreError(f"cannot use {where} (SWITCHBOARD_DATABASE_URL): {failure_line(exc, url)}") from None
    except BaseException:
        await store.close()
        raise
    return store
