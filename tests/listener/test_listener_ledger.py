"""The execution ledger on a real SQLite file: of any number of claims on one job slot — tasks of one
process, connections of their own, real processes — exactly one wins; a claim held by a live owner
is not taken, one left by an owner that is gone is; the same goes for the runs' delivery claim and
for recording a run under an intent."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from bot.services import STORE_MIGRATIONS
from common.store import open_store, process_session
from listener.ledger import STALE_CLAIM_S, ExecutionLedger, process_alive, process_owner
from runs.repository import RunRepository
from tests.support.paths import SUPPORT

HELPER = str(SUPPORT / "ledger_claim.py")
KEY = '["command","call_1","turn",0]'
NOW = 1_750_000_000.0


async def seeded(home: Path, *, slot: str | None = None, run_state: str | None = None, database_url: str | None = None):
    """A store with call_1 archived; `slot`: its command slot's state left by an earlier attempt;
    `run_state`: run 1 in that state."""
    store = await open_store(home, STORE_MIGRATIONS, database_url=database_url)
    await store.execute("INSERT INTO transcripts (id, conversation_id, raw, received_at) VALUES (1, 'call_1', '', ?)",
                        (NOW,))
    if slot is not None:
        await store.execute("INSERT INTO listener_jobs (dedupe_key, transcript_id, kind, state, created_at) VALUES "
                            "(?, 1, 'command', ?, ?)", (KEY, slot, NOW))
    if run_state is not None:
        await store.execute("INSERT INTO runs (id, lane, task, state, owner, idempotency_key, created_at, updated_at) "
                            "VALUES (1, 'command', 't', ?, 'o', 'k', 0, 0)", (run_state,))
    return store


def claim(ledger: ExecutionLedger):
    return ledger.claim_job(key=KEY, transcript_id=1, kind="command", label="book it", deliver="")


@pytest.mark.parametrize("slot", [None, "error"])
async def test_two_tasks_claiming_one_slot_at_once_give_exactly_one_winner(tmp_path, slot, database_url):
    store = await seeded(tmp_path, slot=slot, database_url=database_url)
    try:
        ledger = ExecutionLedger(store, owner=process_owner(), clock=lambda: NOW)
        first, second = await asyncio.gather(claim(ledger), claim(ledger))
        assert sorted([first.won, second.won]) == [False, True]
        loser = second if first.won else first
        assert loser.holder == ledger.owner and not loser.done  # held by the winning task, still starting
        await ledger.started(KEY, "run-7")
        again = await claim(ledger)
        assert again.done and again.job_id == "run-7" and not again.won
    finally:
        await store.close()


@pytest.mark.parametrize("slot", [None, "error"])
async def test_two_connections_claiming_one_slot_at_once_give_exactly_one_winner(tmp_path, slot, database_url):
    """Two stores (two connections each, as two processes have) and two owners that are both alive."""
    store = await seeded(tmp_path, slot=slot, database_url=database_url)
    other = await open_store(tmp_path, STORE_MIGRATIONS, database_url=database_url)
    try:
        one = ExecutionLedger(store, owner="host-a:1:?:a", alive=lambda owner: True, clock=lambda: NOW)
        two = ExecutionLedger(other, owner="host-b:2:?:b", alive=lambda owner: True, clock=lambda: NOW)
        answers = await asyncio.gather(*(claim(ledger) for ledger in (one, two, one, two)))
        assert [a.won for a in answers].count(True) == 1
        winner = (one, two, one, two)[[a.won for a in answers].index(True)]
        assert {a.holder for a in answers if not a.won} == {winner.owner}
    finally:
        await other.close()
        await store.close()


async def test_a_claim_left_by_an_owner_that_is_gone_is_taken_again_and_a_live_ones_is_not(tmp_path, database_url):
    store = await seeded(tmp_path, database_url=database_url)
    try:
        gone = {"host-a:1:?:a"}
        crashed = ExecutionLedger(store, owner="host-a:1:?:a", clock=lambda: NOW)
        assert (await claim(crashed)).won  # ... and the process dies before its run exists
        alive_elsewhere = ExecutionLedger(store, owner="host-b:2:?:b", alive=lambda o: o not in gone,
                                          clock=lambda: NOW)
        assert (await claim(alive_elsewhere)).won
        late = ExecutionLedger(store, owner="host-c:3:?:c", alive=lambda o: True, clock=lambda: NOW + 60)
        held = await claim(late)
        assert not held.won and held.holder == "host-b:2:?:b"
        stale = ExecutionLedger(store, owner="host-c:3:?:c", alive=lambda o: True, clock=lambda: NOW + 601)
        assert (await claim(stale)).won  # a live owner that hung on the start for ten minutes
    finally:
        await store.close()


async def test_another_hosts_claim_is_held_while_its_process_is_connected_to_the_shared_store(tmp_path,
                                                                                              database_url):
    """PostgreSQL: a process on another host is alive while it holds a session on the server (its connections
    carry `process_session(owner)`), and its claim is then not taken; once it is gone, it is. SQLite is never
    shared across hosts: another host's owner there counts as gone at once."""
    store = await seeded(tmp_path, database_url=database_url)
    other_host = "host-elsewhere:4242:777:beef"
    session = None
    try:
        if database_url:
            import psycopg

            session = await psycopg.AsyncConnection.connect(database_url, application_name=process_session(other_host))
        assert (await claim(ExecutionLedger(store, owner=other_host, clock=lambda: NOW))).won
        here = ExecutionLedger(store, owner=process_owner(), clock=lambda: NOW + 60)  # the default `alive`
        found = await claim(here)
        assert found.won is (database_url is None)
        if database_url:
            assert found.holder == other_host
            await session.close()  # the other host's process ends (or its host is cut off)
            async with asyncio.timeout(30):  # its backend leaves the server a moment after the socket closes
                while process_session(other_host) in await store.sessions():
                    await asyncio.sleep(0.02)
            assert (await claim(here)).won
    finally:
        if session is not None:
            await session.close()
        await store.close()


async def test_claims_are_stamped_with_the_stores_clock_unless_one_is_injected(tmp_path, database_url):
    store = await seeded(tmp_path, database_url=database_url)
    try:
        assert (await claim(ExecutionLedger(store, owner=process_owner()))).won
        (claimed_at,) = (await store.fetchone("SELECT claimed_at FROM listener_jobs"))
        after = await store.now()
        assert after - STALE_CLAIM_S < claimed_at <= after  # the store's clock, not the seeded 2025 one
        if database_url:  # ... which on PostgreSQL is the server's
            (server,) = await store.fetchone("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")
            assert after <= server
    finally:
        await store.close()


def test_a_process_owner_is_alive_exactly_while_its_process_runs():
    import subprocess

    assert process_alive(process_owner())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    owner = process_owner().split(":")
    assert not process_alive(":".join([owner[0], str(child.pid), "?", "x"]))
    assert not process_alive("another-host:1:?:x") and not process_alive("garbage")


async def claims_in_processes(home: Path, what: str, count: int, database_url: str | None) -> list[dict]:
    """`count` processes make the same claim at the same moment; their answers, once all answered."""
    procs = [await asyncio.create_subprocess_exec(sys.executable, HELPER, str(home), what,
                                                  *([database_url] if database_url else []),
                                                  stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
             for _ in range(count)]
    try:
        for proc in procs:
            assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"ready\n"
        for proc in procs:  # every process is waiting: let them all go together
            proc.stdin.write(b"go\n")
        await asyncio.gather(*(proc.stdin.drain() for proc in procs))
        return [json.loads(await asyncio.wait_for(proc.stdout.readline(), 30)) for proc in procs]
    finally:
        for proc in procs:  # they held their claims until now
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@pytest.mark.parametrize("slot", [None, "error"])
async def test_processes_claiming_one_slot_at_once_give_exactly_one_winner(tmp_path, slot, database_url):
    store = await seeded(tmp_path, slot=slot, database_url=database_url)
    await store.close()
    answers = await claims_in_processes(tmp_path, "job", 2, database_url)
    assert [a["won"] for a in answers].count(True) == 1, answers
    assert all(a["holder"] for a in answers if not a["won"])  # the loser saw the winner, alive


async def test_processes_claiming_one_run_delivery_at_once_give_exactly_one_winner(tmp_path, database_url):
    store = await seeded(tmp_path, run_state="completed", database_url=database_url)
    await store.close()
    answers = await claims_in_processes(tmp_path, "delivery", 2, database_url)
    assert [a["won"] for a in answers].count(True) == 1, answers


async def test_tasks_and_processes_recording_a_run_under_one_intent_record_one_run(tmp_path, database_url):
    store = await seeded(tmp_path, database_url=database_url)
    try:
        repo = RunRepository(store)
        made = await asyncio.gather(*(repo.create_once(lane="command", task="t", requester_id=None, owner="o",
                                                       idempotency_key="listener-twice", now=1.0) for _ in range(3)))
        assert [created for _, created in made].count(True) == 1 and len({t.id for t, _ in made}) == 1
    finally:
        await store.close()
    answers = await claims_in_processes(tmp_path, "create", 2, database_url)
    assert [a["won"] for a in answers].count(True) == 1 and len({a["run"] for a in answers}) == 1, answers
    store = await open_store(tmp_path, STORE_MIGRATIONS, database_url=database_url)
    try:
        assert (await store.fetchone("SELECT COUNT(*) FROM runs"))[0] == 2
    finally:
        await store.close()


async def test_a_result_never_waits_for_a_card_recorded_while_it_asked(tmp_path, database_url):
    """A result asks to wait for its call's card (one statement reading the call's row) while another
    process records that card in a transaction: the ask waits its turn and sees the card, so it is never
    left waiting for a card that already exists. On PostgreSQL the ask is a transaction (the write lock);
    as a lone statement, READ COMMITTED read the call's row as it was when the statement began."""
    if not database_url:
        pytest.skip("PostgreSQL only here: SQLite runs every write under its one write lock")
    from listener.repository import JobRepository

    store = await seeded(tmp_path, slot="claimed", database_url=database_url)
    other = await open_store(tmp_path, STORE_MIGRATIONS, database_url=database_url)
    try:
        await store.execute("UPDATE listener_jobs SET job_id = 'run-1', state = 'started'")
        async with other.transaction() as tx:  # the card process, mid-transaction
            await tx.execute("UPDATE transcripts SET card = 'discord:1/2' WHERE id = 1")
            asking = asyncio.create_task(JobRepository(store).wait_for_card(KEY, 1))
            async with asyncio.timeout(30):  # until the asking statement waits for the write lock
                while not asking.done() and not (await other.fetchone(
                        "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"))[0]:
                    await asyncio.sleep(0.01)
        assert await asking is False
        assert (await store.fetchone("SELECT delivered FROM listener_jobs"))[0] is None
    finally:
        await other.close()
        await store.close()
