"""The proof that many processes share one store: two `switchboard listen` processes on one store
(SQLite: one home; PostgreSQL: two homes, one database), each offered every call by the fake
Smartnumbers stream, while a named-command run's `switchboard callbacks … --token` writer changes
what runs after calls, over and over; on PostgreSQL also with the server restarted mid-stream.

Every call is archived once, every job (the review and the user's named command) is started once
and posted once, one card per call; an ack says success only when every job of its call has a run
(an event whose acks all said no is delivered again, as Smartnumbers does); and no process ever
says "database is locked" or prints a traceback.
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from bot.services import STORE_MIGRATIONS
from common.store import open_store
from listener.callbacks import Callbacks, MutationTokens
from tests.support.fake_smartnumbers import FakeSmartnumbers
from tests.support.paths import ROOT
from tests.support.postgres import PostgresServer, available, store_env
from tests.support.store import polled, rows_now

KEY = "sn-listener-key-processes"
CALLS = 100  # each offered to both listeners: 200 deliveries, 200 jobs
JOBS_PER_CALL = 2  # the review, and the user's named command
WAITING = "waiting for the call card"
WRITE_EVERY = 20  # acks between the writer's revisions (five in a measured run)


def call_event(i: int, event_id: str | None = None) -> dict:
    """A direct transcript (the local-development path: no download) with one named command."""
    return {"event_id": event_id or f"evt_{i}", "conversation_id": f"call_{i}", "source": "local",
            "metadata": {"direction": "outbound", "from": "+15550001", "to": f"+1555{i:07d}"},
            "turns": [{"speaker": "FROM", "text": f"Ares, note that order {i} is confirmed."},
                      {"speaker": "TO", "text": "Thank you, goodbye."}]}


async def prepared(home: Path, database_url: str | None) -> str:
    """The review on, and the token a named-command run is given (for the writer)."""
    store = await open_store(home, STORE_MIGRATIONS, database_url=database_url)
    try:
        await Callbacks(store, clock=lambda: time.time() - 60).set_review("Summarise the call.", deliver="local")
        return await MutationTokens(store).issue('["call_writer","index",0,0]')  # no call of this test's
    finally:
        await store.close()


async def writer(home: Path, database_url: str | None, token: str, stop: asyncio.Event, log: Path,
                 stream: FakeSmartnumbers) -> list[int]:
    """A named-command run's agent changing the review again and again while calls come in: a revision
    whenever WRITE_EVERY more acks have come, so its writes meet the listeners' all through the run (one
    after another, back to back, they only spent the CPU the listeners race on)."""
    codes: list[int] = []
    with log.open("ab") as out:
        while not stop.is_set():
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "--env-file", os.devnull, "callbacks", "review", "set",
                f"Summarise the call (revision {len(codes) + 1}).", "--deliver", "local", "--token", token, cwd=ROOT,
                env={"PATH": os.environ.get("PATH", ""), "HOME": str(home.parent), **store_env(home, database_url)},
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out)
            codes.append(await asyncio.wait_for(proc.wait(), 60))
            due = len(stream.acks) + WRITE_EVERY
            progress = asyncio.ensure_future(stream.wait_for(lambda n=due: len(stream.acks) >= n, timeout=3600))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait((progress, stopped), return_when=asyncio.FIRST_COMPLETED)
            for waiting in (progress, stopped):
                waiting.cancel()
            await asyncio.gather(progress, stopped, return_exceptions=True)
    return codes


async def until(predicate, what: str, timeout: float = 60.0) -> None:
    """Wait (polling the store: it is the only thing the processes share) until `predicate()`."""
    await polled(predicate, bool, what, timeout)


async def test_two_listeners_and_a_callbacks_writer_share_one_store_and_lose_nothing(tmp_path, database_url):
    await two_listeners_lose_nothing(tmp_path, database_url)


@pytest.mark.skipif(not available(), reason="no PostgreSQL here")
async def test_two_listeners_on_postgresql_lose_nothing_when_the_server_restarts_mid_stream(tmp_path):
    """A server of its own (the shared one must not restart under other tests), restarted when a third of
    the calls are acked: the listeners wait for it, retry, and every call, job and post is still once."""
    server = PostgresServer(Path(tempfile.mkdtemp(prefix="switchboard-pg-"))).start()

    async def restart(stream: FakeSmartnumbers) -> None:
        await stream.wait_for(lambda: len(stream.acks) >= CALLS * 2 // 3, timeout=60)
        await asyncio.to_thread(server.restart)

    try:
        texts = await two_listeners_lose_nothing(tmp_path, server.url, mid_stream=restart)
        assert any("lost the connection to PostgreSQL" in text for text in texts)
    finally:
        server.remove()


async def two_listeners_lose_nothing(tmp_path: Path, database_url: str | None, *,
                                     mid_stream: Callable[[FakeSmartnumbers], Awaitable[None]] | None = None
                                     ) -> list[str]:
    """Two listeners (two homes on PostgreSQL) and the writer over every call; checks everything was done
    once; the listeners' logs."""
    homes = [tmp_path / "home"] * 2 if database_url is None else [tmp_path / "home-1", tmp_path / "home-2"]
    home = homes[0]

    def rows(sql: str, params: tuple = ()) -> list[tuple]:
        return rows_now(home, database_url, sql, params)

    token = await prepared(home, database_url)
    logs = [tmp_path / "listen-1.log", tmp_path / "listen-2.log"]
    stop_writing = asyncio.Event()
    listeners: list[asyncio.subprocess.Process] = []
    async with FakeSmartnumbers(key=KEY) as stream:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
               "TRANSCRIPT_LISTENER_API_KEY": KEY, "SMARTNUMBERS_STREAM_URL": stream.url,
               "SMARTNUMBERS_ALLOWED_STREAM_HOSTS": "127.0.0.1", "SMARTNUMBERS_ALLOW_INSECURE_LOCAL": "true",
               "SWITCHBOARD_AGENT_LANES": "command", "SWITCHBOARD_AGENT_COMMAND": "echo agent: {task}"}
        writing = during = None
        try:
            for n, (log, its_home) in enumerate(zip(logs, homes, strict=True), start=1):
                with log.open("wb") as out:
                    listeners.append(await asyncio.create_subprocess_exec(
                        sys.executable, "-m", "bot", "--env-file", os.devnull, "listen", cwd=ROOT,
                        env={**env, **store_env(its_home, database_url)},
                        stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out))
                await stream.wait_connection(n, timeout=30)
            writing = asyncio.create_task(writer(home, database_url, token, stop_writing, tmp_path / "writer.log",
                                                 stream))
            if mid_stream is not None:
                during = asyncio.create_task(mid_stream(stream))
            for i in range(CALLS):  # every call to both listeners at once: they race for each step
                await stream.send_event(call_event(i), conn=1)
                await stream.send_event(call_event(i), conn=2)
            await stream.wait_for(lambda: len(stream.acks) >= 2 * CALLS, timeout=60)
            if during is not None:
                await during
            for attempt in range(5):  # as Smartnumbers does: an event no listener acked as done comes again
                unsettled = [i for i in range(CALLS) if not any(a["success"] for _, a in stream.acks_for(f"evt_{i}"))]
                if not unsettled:
                    break
                expected = len(stream.acks) + len(unsettled)
                for i in unsettled:
                    await stream.send_event(call_event(i), conn=1 + attempt % 2)
                await stream.wait_for(lambda n=expected: len(stream.acks) >= n, timeout=60)
            try:
                await until(lambda: rows("SELECT COUNT(*) FROM listener_jobs WHERE delivered IS NOT NULL AND "
                                         "delivered != ? AND delivered NOT LIKE 'posting by %'", (WAITING,))[0][0]
                            >= CALLS * JOBS_PER_CALL, "every result to be posted")
            except AssertionError:  # say which results, and what the listeners said last
                unposted = rows("SELECT j.job_id, j.state, j.delivered, r.state, r.delivery FROM listener_jobs j "
                                "LEFT JOIN runs r ON 'run-' || r.id = j.job_id WHERE j.delivered IS NULL OR "
                                "j.delivered = ? OR j.delivered LIKE 'posting by %'", (WAITING,))
                tails = [log.read_text(errors="replace")[-1500:] for log in logs]
                raise AssertionError(f"results not posted: {unposted[:10]}; listeners said: {tails}") from None
        finally:
            if during is not None and not during.done():
                during.cancel()
            stop_writing.set()
            codes = await writing if writing is not None else []
            for proc in listeners:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
            exits = [await asyncio.wait_for(proc.wait(), 30) for proc in listeners]
        stream.assert_clean()

    texts = [log.read_text(errors="replace") for log in logs]
    writes = (tmp_path / "writer.log").read_text(errors="replace")
    for text in (*texts, writes):
        assert "database is locked" not in text and "Traceback" not in text and "StoreError" not in text, text[-3000:]
    assert exits == [0, 0], [t[-2000:] for t in texts]
    # The writer got its turn every time; a one-shot command started while the server restarts finds no
    # server and says so in one line, exit 2 (it keeps nothing half-done): allowed only during a restart.
    refused = writes.count("cannot use PostgreSQL")
    assert codes.count(0) >= 2 and codes.count(2) == refused and set(codes) <= {0, 2}, writes[-2000:]
    assert mid_stream is not None or refused == 0, writes[-2000:]

    # every call archived exactly once
    archived = rows("SELECT conversation_id FROM transcripts")
    assert sorted(c for (c,) in archived) == sorted(f"call_{i}" for i in range(CALLS))
    # every job started exactly once: one run per slot, one slot per run, no other runs
    slots = rows("SELECT t.conversation_id, j.kind, j.state, j.job_id FROM listener_jobs j JOIN transcripts t "
                       "ON t.id = j.transcript_id")
    assert len(slots) == CALLS * JOBS_PER_CALL and {s[2] for s in slots} == {"started"}
    assert collections.Counter(s[0] for s in slots) == {f"call_{i}": JOBS_PER_CALL for i in range(CALLS)}
    runs = {f"run-{rid}": task for rid, task in rows("SELECT id, task FROM runs")}
    unclaimed = {run: task[:120] for run, task in runs.items() if run not in {s[3] for s in slots}}
    assert sorted(s[3] for s in slots) == sorted(runs), unclaimed  # a run no slot knows: a job started twice
    assert len(set(runs.values())) == len(runs)
    jobs_of = collections.defaultdict(set)
    for conversation, _, _, job_id in slots:
        jobs_of[conversation].add(job_id)
    # an ack said success only when every job of its call had a run; every event got one in the end
    acks = [a for _, a in stream.acks]
    for ack in acks:
        if ack["success"]:
            assert set(ack["job_ids"]) == jobs_of[ack["conversation_id"]], ack
        else:
            assert ack["errors"] and all("still" in e["message"] for e in ack["errors"]), ack
            assert set(ack["job_ids"]) <= jobs_of[ack["conversation_id"]], ack
    assert {a["conversation_id"] for a in acks if a["success"]} == set(jobs_of)
    # every result posted once, under one card per call
    shown = "\n".join(texts)
    posted = collections.Counter(re.findall(r"\(run (\d+)\)\n", shown))
    assert posted == {run.removeprefix("run-"): 1 for run in runs}, posted
    cards = collections.Counter(re.findall(r"── Call to \+1555(\d{7}):", shown))
    assert cards == {f"{i:07d}": 1 for i in range(CALLS)}, cards
    assert rows("SELECT COUNT(*) FROM listener_steps")[0][0] == 0  # no claim left behind
    return texts
