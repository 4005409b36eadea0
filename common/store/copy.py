"""Copy a home's SQLite store into an empty PostgreSQL database, whole: `switchboard store copy`.

In order:
1. `target_data(target)` lists the target's tables that hold rows. Any at all (another application's
   included; the target's own `schema_migrations` aside) and nothing is copied: the caller refuses,
   and nothing has been written.
2. The caller creates the schema on the target (the same numbered migrations, `open_store`), so both
   sides have the same tables at the same versions (`versions_differ` checks).
3. `copy_rows` copies every table in one transaction, parents before children (the target's foreign
   keys), with `COPY … FROM STDIN`: every column the target stores (a generated column, the
   full-text `tsvector`, is computed there), every id as it was. Each table is locked and checked
   empty again first, so a process that started on the target meanwhile makes the copy fail whole.
   Then every sequence is advanced past the highest id copied (and past SQLite's AUTOINCREMENT mark,
   so an id a deleted row had is not given again). An error rolls all of it back.

SQLite's own tables and its FTS5 tables (PostgreSQL searches a generated column instead) are not
copied. A table or column of the source that the target lacks stops the copy: it would be lost.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

BATCH = 5000
_SKIP = frozenset({"schema_migrations", "sqlite_sequence", "sqlite_stat1", "sqlite_stat4"})
_INTEGERS = frozenset({"smallint", "integer", "bigint"})

Progress = Callable[[str, int, int], None]  # (table, rows copied so far, rows in all)


class CopyError(RuntimeError):
    """The copy cannot be made; the message says why, and nothing was written."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # PostgreSQL's data_type, e.g. "bigint", "boolean", "timestamp with time zone"


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def target_tables(target) -> list[str]:
    """The base tables of the target's current schema."""
    rows = target.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
                          "AND table_type = 'BASE TABLE' ORDER BY table_name").fetchall()
    return [row[0] for row in rows]


def target_data(target) -> list[str]:
    """The target's tables that hold at least one row (its `schema_migrations` aside)."""
    return [name for name in target_tables(target) if name != "schema_migrations"
            and target.execute(f"SELECT EXISTS (SELECT 1 FROM {_quoted(name)})").fetchone()[0]]


def versions_differ(source: sqlite3.Connection, target) -> list[str]:
    """`package: source vN, target vM` for every package whose schema versions differ."""
    mine = dict(source.execute("SELECT package, MAX(version) FROM schema_migrations GROUP BY package").fetchall())
    theirs = dict(target.execute("SELECT package, MAX(version) FROM schema_migrations GROUP BY package").fetchall())
    return [f"{p}: source v{mine.get(p, 0)}, target v{theirs.get(p, 0)}" for p in sorted(set(mine) | set(theirs))
            if mine.get(p) != theirs.get(p)]


def source_tables(source: sqlite3.Connection) -> list[str]:
    """The source's tables that hold Switchboard's rows: not SQLite's own, not FTS5's (virtual or shadow)."""
    rows = source.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall()
    virtual = [name for name, sql in rows if (sql or "").upper().startswith("CREATE VIRTUAL TABLE")]
    return [name for name, _ in rows if name not in _SKIP and not name.startswith("sqlite_")
            and not any(name == v or name.startswith(v + "_") for v in virtual)]


def _columns(target, table: str) -> list[Column]:
    rows = target.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = "
                          "current_schema() AND table_name = %s AND is_generated = 'NEVER' "
                          "AND generation_expression IS NULL ORDER BY ordinal_position", (table,)).fetchall()
    return [Column(name, kind) for name, kind in rows]


def _parents_first(target, tables: list[str]) -> list[str]:
    """`tables` ordered so that each comes after every table its foreign keys point at."""
    edges = target.execute(
        "SELECT c.relname, p.relname FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid "
        "JOIN pg_class p ON p.oid = k.confrelid WHERE k.contype = 'f' AND k.connamespace = "
        "current_schema()::regnamespace").fetchall()
    parents: dict[str, set[str]] = {t: set() for t in tables}
    for child, parent in edges:
        if child in parents and parent in parents and child != parent:
            parents[child].add(parent)
    ordered: list[str] = []
    while parents:
        ready = sorted(t for t, waiting in parents.items() if not waiting - set(ordered))
        if not ready:
            raise CopyError(f"the target's foreign keys form a cycle between {', '.join(sorted(parents))}")
        ordered += ready
        for t in ready:
            del parents[t]
    return ordered


def plan(source: sqlite3.Connection, target) -> list[tuple[str, list[Column]]]:
    """Each source table with the target columns to fill, parents first; CopyError when something of
    the source has no place on the target."""
    on_target = set(target_tables(target))
    tables = source_tables(source)
    if missing := [t for t in tables if t not in on_target]:
        raise CopyError(f"the target has no table {', '.join(missing)}: its schema is not this Switchboard's")
    steps = []
    for table in _parents_first(target, tables):
        columns = _columns(target, table)
        have = {row[1] for row in source.execute(f"PRAGMA table_info({_quoted(table)})")}
        if lost := sorted(have - {c.name for c in columns}):
            raise CopyError(f"the target's table {table} has no column {', '.join(lost)}: its schema is not this "
                            f"Switchboard's")
        steps.append((table, [c for c in columns if c.name in have]))
    return steps


def _converter(column: Column) -> Callable[[Any], Any] | None:
    """How a SQLite value becomes what the target column takes, where the two differ."""
    if column.type == "boolean":
        return lambda v: None if v is None else bool(v)
    if column.type in _INTEGERS:
        return lambda v: int(v) if isinstance(v, float) and v.is_integer() else v
    if column.type.startswith("timestamp"):
        return lambda v: datetime.fromtimestamp(v, UTC) if isinstance(v, int | float) else v
    return None


def _rows(source: sqlite3.Connection, table: str, columns: list[Column]) -> Iterator[tuple]:
    names = ", ".join(_quoted(c.name) for c in columns)
    convert = [(i, f) for i, c in enumerate(columns) if (f := _converter(c)) is not None]
    cursor = source.execute(f"SELECT {names} FROM {_quoted(table)} ORDER BY rowid")
    try:
        while batch := cursor.fetchmany(BATCH):
            for row in batch:
                if convert:
                    row = list(row)
                    for i, f in convert:
                        row[i] = f(row[i])
                yield tuple(row)
    finally:
        cursor.close()


def _high_water(source: sqlite3.Connection) -> dict[str, int]:
    """SQLite's AUTOINCREMENT marks: ids never to be given again, even where their rows were deleted."""
    try:
        return dict(source.execute("SELECT name, seq FROM sqlite_sequence").fetchall())
    except sqlite3.OperationalError:  # no AUTOINCREMENT table in this store
        return {}


def _advance_sequences(source: sqlite3.Connection, target, table: str, columns: list[Column]) -> None:
    for column in columns:
        sequence = target.execute("SELECT pg_get_serial_sequence(%s, %s)", (_quoted(table), column.name)).fetchone()[0]
        if sequence is None:
            continue
        highest = target.execute(f"SELECT MAX({_quoted(column.name)}) FROM {_quoted(table)}").fetchone()[0] or 0
        highest = max(highest, _high_water(source).get(table, 0))
        # setval(…, false) on an empty table: the next id is 1, as SQLite would give
        target.execute("SELECT setval(%s, %s, %s)", (sequence, max(highest, 1), highest > 0))


def copy_rows(source: sqlite3.Connection, target, *, progress: Progress | None = None) -> dict[str, int]:
    """Copy every row of every table (see the module docstring) in one transaction of `target` (a
    psycopg connection, not in autocommit); the rows copied per table. Raises CopyError, or the
    driver's error, with nothing written."""
    steps = plan(source, target)
    counts: dict[str, int] = {}
    with target.transaction():
        for table, _ in steps:
            target.execute(f"LOCK TABLE {_quoted(table)} IN ACCESS EXCLUSIVE MODE")
        if busy := target_data(target):
            raise CopyError(f"the target started holding data while the copy began ({', '.join(busy)}): is a "
                            f"Switchboard already using it? Nothing was copied")
        for table, columns in steps:
            total = source.execute(f"SELECT COUNT(*) FROM {_quoted(table)}").fetchone()[0]
            done = 0
            names = ", ".join(_quoted(c.name) for c in columns)
            with target.cursor() as cursor, cursor.copy(f"COPY {_quoted(table)} ({names}) FROM STDIN") as copy:
                for row in _rows(source, table, columns):
                    copy.write_row(row)
                    done += 1
                    if progress is not None and done % BATCH == 0:
                        progress(table, done, total)
            if progress is not None:
                progress(table, done, total)
            _advance_sequences(source, target, table, columns)
            counts[table] = done
    return counts
