"""The shared SQLite store: owner-only files, WAL, per-package migrations applied exactly once."""

from __future__ import annotations

import asyncio
import os
import stat

import pytest

from common.store import DB_FILENAME, Migration, MigrationError, open_store
from common.store.dialect import split_statements
from runs import MIGRATIONS as RUNS_MIGRATIONS
from tests.support.paths import ROOT
from tests.support.store import damage

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
    latest = RUNS_MIGRATIONS[-1].version
    store = await open_store(tmp_path, RUNS_MIGRATIONS)
    assert await store.versions() == {"runs": latest}
    assert {"runs", "run_steers", "run_events"} <= await tables(store)
    assert await store.migrate(RUNS_MIGRATIONS) == []  # idempotent on the open store
    await store.close()

    again = await open_store(tmp_path, RUNS_MIGRATIONS)  # and on a reopen
    rows = await again.fetchall("SELECT package, version FROM schema_migrations")
    assert [tuple(r) for r in rows] == [("runs", m.version) for m in RUNS_MIGRATIONS]
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
    latest = RUNS_MIGRATIONS[-1].version
    store = await open_store(tmp_path, [*RUNS_MIGRATIONS, *TRANSCRIPTS])
    assert await store.versions() == {"runs": latest, "transcripts": 2}
    assert {"runs", "transcripts", "transcripts_ai"} <= await tables(store)
    await store.close()
    # a process that only knows one package leaves the other's tables and versions alone
    runs_only = await open_store(tmp_path, RUNS_MIGRATIONS)
    assert await runs_only.versions() == {"runs": latest, "transcripts": 2}
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


COUNTER = (Migration("counter", 1, "CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL);"
                                   "INSERT INTO counter (id, n) VALUES (1, 0), (2, 0), (3, 0);"),)


async def test_a_write_waits_its_turn_when_another_process_commits_during_a_read_of_this_one(tmp_path):
    """SQLITE_BUSY_SNAPSHOT: one task's read is open on the store when another process commits, and
    then another task of this process writes. A store that shares one connection between reads and
    writes has that write refused at once ("database is locked", no busy wait applies)."""
    import sqlite3
    import threading

    store = await open_store(tmp_path, COUNTER)
    other = sqlite3.connect(tmp_path / DB_FILENAME, isolation_level=None, timeout=10, check_same_thread=False)
    committed = threading.Event()

    def commit_elsewhere(n):  # called while the read statement is stepping: another process commits now
        if not committed.is_set():
            committed.set()
            other.execute("UPDATE counter SET n = n + 10 WHERE id = 3")
        return n

    try:
        for conn in {id(c): c for c in (store.db, getattr(store, "reader", store.db))}.values():
            await conn.create_function("commit_elsewhere", 1, commit_elsewhere)
        read = asyncio.create_task(store.fetchone("SELECT commit_elsewhere(n) FROM counter ORDER BY id"))
        write = asyncio.create_task(store.execute("UPDATE counter SET n = n + 1 WHERE id = 1"))
        await asyncio.gather(read, write)
        assert committed.is_set()
        rows = await store.fetchall("SELECT id, n FROM counter ORDER BY id")
        assert [tuple(r) for r in rows] == [(1, 1), (2, 0), (3, 10)]
    finally:
        other.close()
        await store.close()


class Pauses:
    """An injected sleep: records each pause and runs `on_pause` (e.g. the other process lets go)."""

    def __init__(self, on_pause=None) -> None:
        self.pauses: list[float] = []
        self.on_pause = on_pause

    async def __call__(self, seconds: float) -> None:
        self.pauses.append(seconds)
        if self.on_pause is not None:
            self.on_pause(len(self.pauses))


def holder(tmp_path):
    """Another process's connection, holding the write lock until it commits."""
    import sqlite3

    other = sqlite3.connect(tmp_path / DB_FILENAME, isolation_level=None, timeout=0)
    other.execute("BEGIN IMMEDIATE")
    other.execute("UPDATE counter SET n = n + 10 WHERE id = 2")
    return other


async def test_a_locked_database_is_tried_again_after_jittered_pauses_until_the_lock_is_let_go(tmp_path):
    import random

    from common.store import Busy

    setup = await open_store(tmp_path, COUNTER)
    await setup.close()
    other = holder(tmp_path)
    pauses = Pauses(on_pause=lambda n: n == 2 and other.execute("COMMIT"))  # let go during the 2nd pause
    busy = Busy(timeout_s=0, attempts=4, first_pause_s=0.1, max_pause_s=1.0, sleep=pauses,
                random=random.Random(7).random)
    store = await open_store(tmp_path, COUNTER, busy=busy)
    try:
        async with store.transaction() as conn:
            await conn.execute("UPDATE counter SET n = n + 1 WHERE id = 2")
        assert (await store.fetchone("SELECT n FROM counter WHERE id = 2"))[0] == 11
        expected = random.Random(7)
        assert pauses.pauses == [0.1 * (0.5 + expected.random()), 0.2 * (0.5 + expected.random())]
        assert pauses.pauses[0] != pauses.pauses[1] / 2  # jittered, not lockstep
    finally:
        other.close()
        await store.close()


async def test_a_lock_that_outlasts_every_attempt_is_one_line_saying_what_to_do(tmp_path):
    from common.store import Busy, StoreError

    store = await open_store(tmp_path, COUNTER, busy=Busy(timeout_s=0, attempts=3, sleep=Pauses()))
    other = holder(tmp_path)
    try:
        for write in (lambda: store.execute("UPDATE counter SET n = 0"), lambda: store.insert(
                "INSERT INTO counter (n) VALUES (1)"), lambda: store.migrate(TRANSCRIPTS)):
            with pytest.raises(StoreError) as caught:
                await write()
            assert "\n" not in str(caught.value) and str(tmp_path / DB_FILENAME) in str(caught.value)
            assert "locked by another process" in str(caught.value) and "try again" in str(caught.value)
        assert (await store.fetchone("SELECT n FROM counter WHERE id = 1"))[0] == 0  # reads never wait
    finally:
        other.close()
        await store.close()


async def test_a_cancelled_transaction_lets_go_of_the_lock_for_every_other_process(tmp_path):
    import sqlite3

    store = await open_store(tmp_path, COUNTER)
    inside = asyncio.Event()

    async def interrupted() -> None:
        async with store.transaction() as conn:
            await conn.execute("UPDATE counter SET n = 99 WHERE id = 1")
            inside.set()
            await asyncio.Event().wait()  # cancelled here, mid-transaction

    task = asyncio.create_task(interrupted())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    other = sqlite3.connect(tmp_path / DB_FILENAME, isolation_level=None, timeout=0)  # no waiting at all
    try:
        other.execute("UPDATE counter SET n = 5 WHERE id = 1")
        assert (await store.fetchone("SELECT n FROM counter WHERE id = 1"))[0] == 5  # rolled back, then theirs
        await store.execute("UPDATE counter SET n = n + 1 WHERE id = 1")  # and this process writes again
        assert other.execute("SELECT n FROM counter WHERE id = 1").fetchone()[0] == 6
    finally:
        other.close()
        await store.close()


async def test_a_read_sees_every_write_committed_before_it_in_this_process_and_others(tmp_path):
    import sqlite3

    store = await open_store(tmp_path, COUNTER)
    other = sqlite3.connect(tmp_path / DB_FILENAME, isolation_level=None, timeout=5)
    try:
        for i in range(1, 20):
            await store.execute("UPDATE counter SET n = ? WHERE id = 1", (i,))
            assert (await store.fetchone("SELECT n FROM counter WHERE id = 1"))[0] == i
            other.execute("UPDATE counter SET n = ? WHERE id = 2", (i,))
            assert (await store.fetchall("SELECT n FROM counter WHERE id = 2"))[0][0] == i
    finally:
        other.close()
        await store.close()


# -- a file that cannot be the store --------------------------------------------------------------

DAMAGE = ("not a database", "truncated", "directory", "fifo")


@pytest.mark.parametrize("kind", DAMAGE)
async def test_a_damaged_store_is_one_line_naming_the_file_and_nothing_is_deleted(tmp_path, kind):
    from common.store import StoreError, check_store

    home = tmp_path / "home"
    before = damage(home, kind)
    path = home / DB_FILENAME
    with pytest.raises(StoreError) as caught:
        await open_store(home, RUNS_MIGRATIONS)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and "move it aside" in message, message
    assert "Nothing is deleted for you" in message
    if before is not None:
        assert path.read_bytes() == before and not (home / (DB_FILENAME + ".damaged")).exists()
    elif kind == "directory":
        assert (path / "keep.txt").read_text() == "mine"
    assert check_store(home, RUNS_MIGRATIONS) == message or "move it aside" in check_store(home, RUNS_MIGRATIONS)


async def test_a_store_from_a_newer_switchboard_is_one_line_and_left_as_it_was(tmp_path):
    from common.store import MigrationError, check_store

    store = await open_store(tmp_path, TRANSCRIPTS)
    await store.close()
    before = (tmp_path / DB_FILENAME).read_bytes()
    with pytest.raises(MigrationError) as caught:
        await open_store(tmp_path, TRANSCRIPTS[:1])
    assert "\n" not in str(caught.value) and "newer than this Switchboard knows (1)" in str(caught.value)
    assert "upgrade Switchboard" in str(caught.value)
    assert check_store(tmp_path, TRANSCRIPTS[:1]) == str(caught.value)
    assert check_store(tmp_path, TRANSCRIPTS) is None
    assert (tmp_path / DB_FILENAME).read_bytes() == before


async def test_check_store_reads_only_and_finds_damage_deep_inside_a_file_that_opens(tmp_path):
    import sqlite3

    from common.store import check_store

    assert check_store(tmp_path / "new") is None and not (tmp_path / "new").exists()  # created on first use
    store = await open_store(tmp_path, COUNTER)
    await store.close()
    assert check_store(tmp_path, COUNTER) is None
    # corrupt a page of a table's b-tree (the header and the schema still read fine)
    db = sqlite3.connect(tmp_path / DB_FILENAME)
    db.execute("CREATE TABLE big (id INTEGER PRIMARY KEY, text TEXT)")
    db.executemany("INSERT INTO big (text) VALUES (?)", [("y" * 500,)] * 200)
    db.commit()
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    (root,) = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'big'").fetchone()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    with open(tmp_path / DB_FILENAME, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * 64)
    problem = check_store(tmp_path, COUNTER)
    assert problem is not None and "not a usable Switchboard database" in problem and "\n" not in problem


def test_a_test_that_fails_with_a_store_open_fails_instead_of_hanging(tmp_path):
    """The store's connection threads are daemons: pytest (any interpreter) exits after a failure
    that left a store open, instead of waiting forever for the thread at shutdown."""
    import subprocess
    import sys

    (tmp_path / "test_left_open.py").write_text(
        "from common.store import open_store\n\n"
        "async def test_fails_with_the_store_open(tmp_path):\n"
        "    store = await open_store(tmp_path)\n"
        "    assert False, 'failing on purpose'\n")
    root = ROOT
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
                               "--rootdir", str(tmp_path), str(tmp_path / "test_left_open.py")], cwd=root,
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(root)})
    except subprocess.TimeoutExpired:
        pytest.fail("pytest hung after a test failed with a store open")
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout[-2000:]


async def test_a_read_sees_a_commit_made_while_another_tasks_read_was_in_flight(tmp_path):
    """Reads of several tasks share the reader: none may leave its statement (and so its snapshot)
    open for the others, or a read that starts after a commit would not see it."""
    import threading

    store = await open_store(tmp_path, COUNTER)
    gate, reading = threading.Event(), threading.Event()

    def held_until_the_commit(n):  # the first task's read is in flight until the write has committed
        reading.set()
        gate.wait(10)
        return n

    try:
        for conn in {id(c): c for c in (store.db, getattr(store, "reader", store.db))}.values():
            await conn.create_function("held_until_the_commit", 1, held_until_the_commit)
        first = asyncio.create_task(store.fetchone("SELECT held_until_the_commit(n) FROM counter ORDER BY id"))
        assert await asyncio.to_thread(reading.wait, 10)  # its statement has begun: its snapshot is taken
        await asyncio.wait_for(store.execute("UPDATE counter SET n = 42 WHERE id = 1"), 10)
        later = asyncio.create_task(store.fetchall("SELECT n FROM counter WHERE id = 1"))
        await asyncio.sleep(0)
        gate.set()
        assert (await first)[0] == 0  # it began before the commit
        assert (await later)[0][0] == 42
    finally:
        gate.set()
        await store.close()


async def test_a_read_never_sees_what_another_task_has_not_committed(tmp_path):
    store = await open_store(tmp_path, COUNTER)
    written, finish = asyncio.Event(), asyncio.Event()

    async def changes_its_mind() -> None:
        async with store.transaction() as conn:
            await conn.execute("UPDATE counter SET n = 99 WHERE id = 1")
            written.set()
            await finish.wait()
            raise RuntimeError("rolled back")

    task = asyncio.create_task(changes_its_mind())
    try:
        await asyncio.wait_for(written.wait(), 10)
        assert (await asyncio.wait_for(store.fetchone("SELECT n FROM counter WHERE id = 1"), 10))[0] == 0
        finish.set()
        with pytest.raises(RuntimeError):
            await task
        assert (await store.fetchall("SELECT n FROM counter WHERE id = 1"))[0][0] == 0
    finally:
        finish.set()
        await store.close()


async def test_a_transaction_cancelled_while_its_begin_waits_is_rolled_back_and_the_next_one_starts(tmp_path):
    store = await open_store(tmp_path / "home", [Migration("notes", 1, "CREATE TABLE notes (text TEXT);")])
    try:
        entered = asyncio.Event()

        async def write() -> None:
            async with store.transaction() as conn:
                entered.set()
                await conn.execute("INSERT INTO notes (text) VALUES ('never')")

        for turns in range(4):  # cancelled before, during and after its BEGIN reached the writer's thread
            task = asyncio.create_task(write())
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            async with store.transaction() as conn:  # "cannot start a transaction within a transaction" before
                await conn.execute("SELECT 1")
        assert not store.db.in_transaction
        assert await store.fetchall("SELECT * FROM notes") == []  # nothing cancelled was committed
    finally:
        await store.close()
