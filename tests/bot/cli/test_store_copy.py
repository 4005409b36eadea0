"""`switchboard store copy --to URL`: a home filled through the real repositories, copied into an empty
PostgreSQL database, then read back through the same repositories there (search included); a target
that holds data, or a home still in use, is refused with one line and nothing written."""

from __future__ import annotations

import asyncio
import sqlite3

import psycopg
import pytest

from bot.cli import store as store_cli
from bot.services import STORE_MIGRATIONS
from common.store import DB_FILENAME, open_store
from common.store.copy import source_tables
from listener.archive import Archive
from listener.callbacks import Callbacks
from listener.ledger import ExecutionLedger
from listener.memory import Memory
from listener.model import Transcript, Turn
from runs.repository import RunRepository
from tests.support.cli import switchboard
from tests.support.filled_home import CALLBACK, FACT, REVIEW, TASK, fill
from voice.call.records import CallRecords

PASSWORD = "copy-secret-Zq81"


@pytest.fixture
def target(postgres_server) -> str:
    """A fresh, empty PostgreSQL database's URL."""
    if postgres_server is None:
        from tests.support.postgres import SKIPPED

        pytest.skip(SKIPPED)
    return postgres_server.new_database()


async def filled_home(tmp_path, calls: int = 3):
    home = tmp_path / "home"
    store = await open_store(home, STORE_MIGRATIONS)
    try:
        filled = await fill(store, calls=calls)
    finally:
        await store.close()
    return home, filled


def counts_in_sqlite(home) -> dict[str, int]:
    with sqlite3.connect(home / DB_FILENAME) as db:
        return {t: db.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in source_tables(db)}


def counts_in_postgres(url: str) -> dict[str, int]:
    with psycopg.connect(url) as db:
        names = [r[0] for r in db.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = "
                                          "current_schema() AND table_name <> 'schema_migrations'")]
        return {t: db.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in names}


async def copy(home, url: str) -> tuple[int, str, str]:
    return await asyncio.to_thread(switchboard, ["store", "copy", "--to", url], {"SWITCHBOARD_HOME": str(home)})


async def test_a_home_copied_whole_reads_back_through_the_repositories_on_postgresql(tmp_path, target):
    home, filled = await filled_home(tmp_path)
    code, out, err = await copy(home, target)
    assert code == 0, err
    expected = counts_in_sqlite(home)
    assert counts_in_postgres(target) == expected and all(expected.values()), expected  # every row of every table
    printed = dict(line.split(None, 1) for line in out.splitlines()[1:])
    assert {t: int(n.replace(",", "")) for t, n in printed.items()} == expected  # the count per table
    store = await open_store(tmp_path / "unused", STORE_MIGRATIONS, database_url=target)
    try:
        runs = RunRepository(store)
        ticket = await runs.get(filled.run_id)
        assert ticket.task == TASK and ticket.requester_id == 4242 and ticket.origin == "call-7"
        assert "note" in [e.kind for e in await runs.events(filled.run_id)]
        archive = Archive(store)
        found = await archive.search("Jose 48213")  # accents folded, the number whole: search works there too
        assert sorted(r["transcript_id"] for r in found["results"]) == list(range(1, filled.calls + 1))
        assert (await archive.search("4821"))["results"] == []
        shown = await archive.show(filled.conversation_id)
        assert shown["id"] == filled.transcript_id and [f["fact"] for f in shown["facts"]] == [FACT]
        assert {c.id for c in await Callbacks(store).list()} >= {CALLBACK}
        assert (await Callbacks(store).review()).instructions == REVIEW
        assert FACT in [f["fact"] for f in await Memory(store).facts()]
        assert await ExecutionLedger(store).job_ids(filled.transcript_id) == ["run-1"]
        call = await CallRecords(store).get(filled.call_id)
        assert call.state == "ended" and call.guild_id == 77
        # ids are kept, and new rows get ids past them (the sequences were advanced)
        newer = await archive.archive(Transcript("conv-new", (Turn(0, "FROM", "hello again"),)), "{}",
                                      received_at=2e9, user_label="TO")
        assert newer.transcript_id == filled.calls + 1
        another = await runs.create(lane="command", task="next", requester_id=None, owner="h:1:bot",
                                    idempotency_key="next", now=2e9)
        assert another.id == filled.run_id + 1
        assert await CallRecords(store).start(guild_id=1, voice_channel_id=2, text_channel_id=None, started_by=None,
                                              mode="always", captions=False, at=2e9) == filled.call_id + 1
    finally:
        await store.close()
    # doctor reads that database, not the home's old file: the store row and what runs after each call
    env = {"SWITCHBOARD_HOME": str(home), "SWITCHBOARD_DATABASE_URL": target, "SWITCHBOARD_AGENT_LANES": "command",
           "TRANSCRIPT_LISTENER_API_KEY": "listener-key"}
    (home / DB_FILENAME).rename(home / "moved-aside.db")
    code, out, err = await asyncio.to_thread(switchboard, ["doctor"], env)
    store_row = next(line for line in out.splitlines() if line.split()[1:2] == ["store"])
    assert store_row.startswith("ok") and "PostgreSQL" in store_row, out
    assert f"review on; 1 callback(s) enabled: {CALLBACK}" in out, out


async def test_a_target_that_holds_data_is_refused_with_nothing_written(tmp_path, target):
    home, _ = await filled_home(tmp_path)
    with psycopg.connect(target, autocommit=True) as db:
        db.execute("CREATE TABLE notes (id int); INSERT INTO notes VALUES (1)")
    code, out, err = await copy(home, target)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "already holds data (in notes)" in err and "nothing was written" in err
    assert counts_in_postgres(target) == {"notes": 1}  # not even the tables were made


async def test_a_second_copy_into_the_same_database_is_refused_and_changes_nothing(tmp_path, target):
    home, _ = await filled_home(tmp_path)
    assert (await copy(home, target))[0] == 0
    before = counts_in_postgres(target)
    code, _, err = await copy(home, target)
    assert code == 2 and "already holds data" in err and len(err.strip().splitlines()) == 1
    assert counts_in_postgres(target) == before


async def test_a_home_still_in_use_is_refused(tmp_path, target):
    home, _ = await filled_home(tmp_path)
    store = await open_store(home, STORE_MIGRATIONS)  # a running switchboard
    try:
        code, _, err = await copy(home, target)
    finally:
        await store.close()
    assert code == 2 and "in use by another process" in err
    assert counts_in_postgres(target) == {}


async def test_a_large_table_shows_progress_and_the_password_is_never_printed(tmp_path, postgres_server, target,
                                                                              monkeypatch):
    from urllib.parse import urlsplit, urlunsplit

    home, _ = await filled_home(tmp_path, calls=40)
    monkeypatch.setattr(store_cli, "PROGRESS_FROM", 50)
    with psycopg.connect(target, autocommit=True) as db:
        db.execute(f"CREATE ROLE copier LOGIN PASSWORD '{PASSWORD}'")
        db.execute("GRANT ALL ON SCHEMA public TO copier")
    parts = urlsplit(target)
    as_copier = urlunsplit(parts._replace(netloc=f"copier:{PASSWORD}@{parts.netloc.split('@')[-1]}"))
    code, out, err = await copy(home, as_copier)
    assert code == 0, err
    assert "transcript_turns: 120 of 120 rows (100%)" in err.splitlines()
    assert PASSWORD not in out + err
