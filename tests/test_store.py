"""The shared SQLite store: owner-only files, WAL, per-package migrations applied exactly once."""

from __future__ import annotations

import asyncio
import os
import stat

import pytest

from bot.runs import MIGRATIONS as RUNS_MIGRATIONS
from bot.store import DB_FILENAME, Migration, MigrationError, open_store
from bot.store.db import split_statements

TRANSCRIPTS = (
    Migration("transcripts", 1, "CREATE TABLE transcripts (id INTEGER PRIMARY KEY, text TEXT NOT NULL);"),
    Migration("transcripts", 2, """
        CREATE VIRTUAL TABLE transcripts_fts USING fts5(text, content='transcripts', content_rowid='id');
        CREATE TRIGGER transcripts_ai AFTER INSERT ON transcripts BEGIN
            INSERT INTO transcripts_fts (rowid, text) VALUES (new.id, new.text);
        END;
    """),
)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def tables(store) -> set[str]:
    rows = await store.fetchall("SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger')")
    return {r[0] for r in rows}


async def test_migrations_apply_once_and_record_their_version(tmp_path):
    store = await open_store(tmp_path, RUNS_MIGRATIONS)
    assert await store.versions() == {"runs": 1}
    assert {"runs", "run_steers", "run_events"} <= await tables(store)
    assert await store.migrate(RUNS_MIGRATIONS) == []  # idempotent on the open store
    await store.close()

    again = await open_store(tmp_path, RUNS_MIGRATIONS)  # and on a reopen
    rows = await again.fetchall("SELECT package, version FROM schema_migrations")
    assert [tuple(r) for r in rows] == [("runs", 1)]
    await again.close()


async def test_a_later_version_applies_only_the_new_step(tmp_path):
    store = await open_store(tmp_path, TRANSCRIPTS[:1])
    await store.db.execute("INSERT INTO transcripts (text) VALUES ('kept across the upgrade')")
    applied = await store.migrate(TRANSCRIPTS)
    assert [m.version for m in applied] == [2]
    await store.db.execute("INSERT INTO transcripts (text) VALUES ('hello there')")
    hits = await store.fetchall("SELECT rowid FROM transcripts_fts WHERE transcripts_fts MATCH 'hello'")
    assert len(hits) == 1
    assert (await store.fetchone("SELECT COUNT(*) FROM transcripts"))[0] == 2
    await store.close()


async def test_two_packages_migrations_coexist_in_one_file(tmp_path):
    store = await open_store(tmp_path, [*RUNS_MIGRATIONS, *TRANSCRIPTS])
    assert await store.versions() == {"runs": 1, "transcripts": 2}
    assert {"runs", "transcripts", "transcripts_ai"} <= await tables(store)
    await store.close()
    # a process that only knows one package leaves the other's tables and versions alone
    runs_only = await open_store(tmp_path, RUNS_MIGRATIONS)
    assert await runs_only.versions() == {"runs": 1, "transcripts": 2}
    await runs_only.close()


async def test_files_are_owner_only_and_the_journal_is_wal(tmp_path):
    home = tmp_path / "home"
    store = await open_store(home, RUNS_MIGRATIONS)
    await store.db.execute("INSERT INTO runs (lane, task, state, owner, idempotency_key, created_at, updated_at) "
                           "VALUES ('command', 't', 'starting', 'o', 'k', 0, 0)")
    assert (await store.fetchone("PRAGMA journal_mode"))[0] == "wal"
    names = {p.name for p in store.files}
    assert {DB_FILENAME, DB_FILENAME + "-wal", DB_FILENAME + "-shm"} <= names
    assert mode(home) == 0o700
    for path in store.files:
        assert mode(path) == 0o600, path
    await store.close()


async def test_loose_permissions_on_an_existing_home_and_database_are_tightened(tmp_path):
    home = tmp_path / "loose"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    (home / DB_FILENAME).touch()
    os.chmod(home / DB_FILENAME, 0o644)
    store = await open_store(home, RUNS_MIGRATIONS)
    assert mode(home) == 0o700 and mode(home / DB_FILENAME) == 0o600
    await store.close()


async def test_a_failing_migration_leaves_neither_its_tables_nor_its_version(tmp_path):
    broken = [Migration("notes", 1, "CREATE TABLE notes (id INTEGER); CREATE TABLE notes (id INTEGER);")]
    with pytest.raises(Exception, match="already exists"):
        await open_store(tmp_path, broken)
    store = await open_store(tmp_path)
    assert "notes" not in await tables(store)
    assert await store.versions() == {}
    await store.close()


async def test_malformed_migration_lists_and_newer_databases_are_refused(tmp_path):
    with pytest.raises(MigrationError, match="without gaps"):
        await open_store(tmp_path, [Migration("x", 1, "SELECT 1;"), Migration("x", 3, "SELECT 1;")])
    with pytest.raises(MigrationError, match="lowercase"):
        await open_store(tmp_path, [Migration("Bad Name", 1, "SELECT 1;")])
    store = await open_store(tmp_path, TRANSCRIPTS)
    await store.close()
    with pytest.raises(MigrationError, match="newer than this Switchboard knows"):
        await open_store(tmp_path, TRANSCRIPTS[:1])


async def test_two_processes_opening_at_once_apply_each_migration_once(tmp_path):
    first, second = await asyncio.gather(open_store(tmp_path), open_store(tmp_path))
    applied = await asyncio.gather(first.migrate(TRANSCRIPTS), second.migrate(TRANSCRIPTS))
    assert sorted(len(a) for a in applied) == [0, 2]
    assert await first.versions() == {"transcripts": 2}
    await first.close()
    await second.close()


def test_statements_split_on_semicolons_outside_strings_and_trigger_bodies():
    sql = """
        CREATE TABLE a (x TEXT DEFAULT 'semi;colon');
        CREATE TRIGGER t AFTER INSERT ON a BEGIN
            INSERT INTO a (x) VALUES ('one;'); SELECT 1;
        END;
        ;
    """
    parts = split_statements(sql)
    assert len(parts) == 2
    assert parts[0].endswith("'semi;colon');") and parts[1].rstrip().endswith("END;")
    with pytest.raises(MigrationError, match="incomplete"):
        split_statements("CREATE TABLE b (x TEXT DEFAULT 'open")
