"""A run remembers what started it (a voice call's id), so a call's recap can list its runs."""

from __future__ import annotations

from common.store import open_store
from runs import MIGRATIONS, RunState
from runs.repository import RunRepository
from tests.support.runs import agent_command, harness
from tests.support.store import index_names

CALL = "call-17"
OTHER = "call-18"


async def test_runs_are_listed_per_origin_oldest_first_and_other_calls_runs_are_not(tmp_path, database_url):
    async with harness(tmp_path, lanes=("command",), command=agent_command("answer"), database_url=database_url) as h:
        first = await h.service.delegate("summarise the logs", 4242, origin=CALL)
        other = await h.service.delegate("draft the notes", 4242, origin=OTHER)
        loose = await h.service.delegate("tidy up", 4242)
        second = await h.service.delegate("check the build", 4343, origin=f"  {CALL} ")
        for delegated in (first, other, loose, second):
            await h.delivered(delegated.run)

        mine = await h.service.tickets_of(CALL)
        assert [t.id for t in mine] == [first.run, second.run]
        assert [t.task for t in mine] == ["summarise the logs", "check the build"]
        assert all(t.origin == CALL and t.state is RunState.COMPLETED for t in mine)
        assert [t.id for t in await h.service.tickets_of(OTHER)] == [other.run]
        assert (await h.service.get(other.run)).origin == OTHER
        assert await h.service.tickets_of("call-1") == []  # a prefix of another call's id is not that call
        assert await h.service.tickets_of("") == [] and await h.service.tickets_of("   ") == []


async def test_a_run_delegated_without_an_origin_has_none_and_belongs_to_no_call(tmp_path, database_url):
    async with harness(tmp_path, lanes=("command",), command=agent_command("answer"), database_url=database_url) as h:
        plain = await h.service.delegate("summarise the logs", 4242)
        blank = await h.service.delegate("and again", 4242, origin="  ")
        assert plain.summary.startswith("run 1 is starting on command")
        done = await h.delivered(plain.run)
        assert done.origin is None and done.output.strip() == "answer: summarise the logs"
        assert (await h.delivered(blank.run)).origin is None
        assert await h.service.tickets_of("None") == []
        rows = await h.service.store.fetchall("SELECT origin FROM runs ORDER BY id")
        assert [r["origin"] for r in rows] == [None, None]


async def test_a_retry_under_the_same_idempotency_key_keeps_the_first_origin(tmp_path, database_url):
    async with harness(tmp_path, lanes=("command",), command=agent_command("answer"), database_url=database_url) as h:
        first = await h.service.delegate("summarise the logs", idempotency_key="k1", origin=CALL)
        again = await h.service.delegate("summarise the logs", idempotency_key="k1", origin=OTHER)
        assert again.already and again.run == first.run
        await h.delivered(first.run)
        assert [t.id for t in await h.service.tickets_of(CALL)] == [first.run]
        assert await h.service.tickets_of(OTHER) == []


async def test_the_origin_migration_upgrades_a_store_made_by_the_previous_schema_and_keeps_its_runs(tmp_path, database_url):
    home = tmp_path / "home"
    old = await open_store(home, MIGRATIONS[:1], database_url=database_url)
    try:
        assert await old.versions() == {"runs": 1}
        await old.execute("INSERT INTO runs (lane, task, state, requester_id, owner, idempotency_key, output, "
                          "created_at, updated_at, finished_at) VALUES ('command', 'before the upgrade', "
                          "'completed', 4242, 'o', 'old-key', 'it worked', 10, 20, 20)")
    finally:
        await old.close()

    store = await open_store(home, MIGRATIONS, database_url=database_url)
    try:
        assert await store.versions() == {"runs": 2}
        assert "runs_by_origin" in await index_names(store, "runs")
        repo = RunRepository(store)
        kept = await repo.get(1)
        assert kept is not None and kept.task == "before the upgrade" and kept.output == "it worked"
        assert kept.state is RunState.COMPLETED and kept.requester_id == 4242 and kept.origin is None
        new = await repo.create(lane="command", task="after", requester_id=None, owner="o", idempotency_key="new",
                                now=30.0, origin=CALL)
        assert new.id == 2 and new.origin == CALL
        assert [t.id for t in await repo.of_origin(CALL)] == [2]
        assert await store.migrate(MIGRATIONS) == []  # applied once
    finally:
        await store.close()
