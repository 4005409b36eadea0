"""What a scrape reads from the process: runs counted by state in the store (real runs, real SQLite),
and a store that cannot be read leaving the runs out — said once, not once per scrape."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from bot.fleet.readiness import Readiness
from bot.fleet.readings import ProcessParts
from tests.support.runs import agent_command, harness


async def test_runs_are_counted_by_state_from_the_store(tmp_path):
    async with harness(tmp_path, lanes=("command",), command=agent_command("answer")) as h:
        for task in ("summarise the logs", "draft the notes"):
            await h.delivered((await h.service.delegate(task, 4242)).run)
        await h.service.repo.create(lane="command", task="not started yet", requester_id=None, owner="elsewhere",
                                    idempotency_key="k-start", now=1.0)
        reading = await ProcessParts(Readiness(), h.service).read()
    assert reading.runs == {"completed": 2, "starting": 1}
    assert (reading.voice_calls, reading.shards_held, reading.turns_committed, reading.ready) == (0, 0, 0, False)
    assert reading.listener_lag_s is None  # no listener in this process


async def test_an_unreadable_store_leaves_the_runs_out_and_is_logged_once_until_it_recovers(caplog):
    failing = {"now": True}

    async def count_by_state() -> dict[str, int]:
        if failing["now"]:
            raise OSError("disk I/O error")
        return {"running": 1}

    parts = ProcessParts(Readiness(), SimpleNamespace(repo=SimpleNamespace(count_by_state=count_by_state)))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        assert (await parts.read()).runs is None
        assert (await parts.read()).runs is None
        failing["now"] = False
        assert (await parts.read()).runs == {"running": 1}
        failing["now"] = True
        assert (await parts.read()).runs is None
    assert caplog.text.count("the runs could not be counted: disk I/O error") == 2  # once per outage
