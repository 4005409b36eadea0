"""The store as another process leaves it: `polled` waits for what a process under test wrote, and
`damage` makes a damaged store for the tests that show nothing is ever deleted or repaired behind the
user's back."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any, TypeVar

from common.store import DB_FILENAME

T = TypeVar("T")
POLL_S = 0.05


async def polled(read: Callable[[], T], predicate: Callable[[T], Any], what: str, timeout: float) -> T:
    """`read()` once `predicate` holds of it, polled every POLL_S: another process's writes to the shared
    file cannot be waited on. Fails the test, saying `what` and the last read, after `timeout` s."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate(found := read()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {found}")
        await asyncio.sleep(POLL_S)
    return found


def rows_now(home, database_url: str | None, sql: str, params: tuple = ()) -> list[tuple]:
    """`sql`'s rows, read now through a connection of its own (synchronous: for `polled`)."""
    if database_url is None:
        import sqlite3

        with contextlib.closing(sqlite3.connect(home / DB_FILENAME, timeout=30)) as db:
            return db.execute(sql, params).fetchall()
    import psycopg

    from common.store.dialect import postgresql_sql

    with psycopg.connect(database_url) as db:
        return db.execute(postgresql_sql(sql), params).fetchall()


async def read_elsewhere(home, database_url: str | None, sql: str, params=()) -> list:
    """`sql`'s rows as another process sees the store (its own connections, opened now)."""
    from common.store import open_store

    other = await open_store(home, database_url=database_url, create=False)
    try:
        return list(await other.fetchall(sql, params))
    finally:
        await other.close()


async def index_names(store, table: str) -> set[str]:
    """The names of `table`'s indexes, on either engine."""
    if store.engine == "sqlite":
        rows = await store.fetchall("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?", (table,))
    else:
        rows = await store.fetchall("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
                                    "AND tablename = ?", (table,))
    return {row[0] for row in rows}


async def recorded_home(home) -> None:
    """A store in `home` as the first `switchboard run`, `listen` or `talk` leaves it: every table, no rows."""
    from bot.services import STORE_MIGRATIONS
    from common.store import open_store

    await (await open_store(home, STORE_MIGRATIONS)).close()


def damage(home, kind: str) -> bytes | None:
    """Put a damaged store in `home`; returns the file's bytes (to show nothing was changed)."""
    import shutil
    import sqlite3

    path = home / DB_FILENAME
    home.mkdir(parents=True, exist_ok=True)
    if kind == "directory":
        path.mkdir()
        (path / "keep.txt").write_text("mine")
        return None
    if kind == "fifo":
        os.mkfifo(path)
        return None
    if kind == "not a database":
        path.write_bytes(b"these are my notes, not a database\n" * 50)
        return path.read_bytes()
    good = home.parent / f"good-{kind.replace(' ', '-')}.db"
    db = sqlite3.connect(good)
    db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    db.executemany("INSERT INTO notes (text) VALUES (?)", [("x" * 300,)] * 500)
    db.commit()
    db.close()
    if kind == "truncated":
        data = good.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    else:
        shutil.copy(good, path)
    return path.read_bytes()
