"""Where a finished listener run lands, on a real store: its job's target, the review into the
archive, the token revoked, a failed post kept in the ledger, anything else passed on unchanged.
And the listener's voice tools: read-only search for anyone, the config tool behind the gate."""

from __future__ import annotations

import asyncio
import json

import pytest

from bot.discord.gate import OperatorGate, PhoneDataGate
from bot.phone.delivery import ListenerDelivery, TerminalPoster, card_reference
from bot.services import STORE_MIGRATIONS
from bot.tools.phone import transcript_tools
from common.store import open_store
from listener.archive import Archive
from listener.callbacks import Callbacks, MutationTokens
from listener.pipeline import TranscriptPipeline
from runs import RunState, RunTicket
from voice.call.attribution import Attribution, CallInfo
from voice.call.tools import ToolCatalogue

OPERATOR, GUEST = 111111111111111111, 222222222222222222
DEFAULT_CHANNEL, OTHER_CHANNEL = 333333333333333333, 444444444444444444


class Poster:
    def __init__(self, fail: bool = False) -> None:
        self.results: list = []
        self.fail = fail

    async def post_card(self, card) -> str:
        self.results.append(("card", card.conversation_id))
        return card_reference(DEFAULT_CHANNEL, 100)

    async def post_result(self, result) -> str:
        if self.fail:
            raise RuntimeError("Missing Access")
        self.results.append(result)
        return f"posted in {result.channel_id}"


class Fallback:
    def __init__(self) -> None:
        self.tickets: list = []

    async def post_run(self, ticket) -> None:
        self.tickets.append(ticket)


class Jobs:
    def __init__(self) -> None:
        self.n = 0

    async def start_job(self, job) -> str:
        self.n += 1
        return f"run-{self.n}"


def ticket(run_id: int, state: RunState = RunState.COMPLETED, output: str = "done", error: str | None = None):
    return RunTicket(run_id, "command", "task", state, 1.0, 2.0, output=output, error=error, finished_at=2.0)


@pytest.fixture
async def store(tmp_path, database_url):
    store = await open_store(tmp_path, STORE_MIGRATIONS, database_url=database_url)
    callbacks = Callbacks(store, clock=lambda: 0.0)
    await callbacks.set_review("Summarise it.")
    await callbacks.register("elsewhere", "Elsewhere", "Post it elsewhere.", deliver=f"discord:{OTHER_CHANNEL}")
    await callbacks.register("quiet", "Quiet", "Keep it local.", deliver="local")
    direct = {"conversation_id": "call_5", "event_id": "e5", "metadata": {"direction": "outbound", "from": "+1",
                                                                           "to": "+2"},
              "turns": [{"speaker": "FROM", "text": "Ares, book the table."}]}
    ack = await TranscriptPipeline(Archive(store), download=None, jobs=Jobs(), agent_name="Ares",
                                   clock=lambda: 10.0).handle(direct)
    assert ack["job_ids"] == ["run-1", "run-2", "run-3", "run-4"], ack
    async with store.transaction() as conn:
        await conn.execute("UPDATE transcripts SET card = ?", (card_reference(DEFAULT_CHANNEL, 99),))
    yield store
    await store.close()


async def test_each_result_goes_to_its_jobs_target_and_the_review_into_the_archive(store):
    poster, fallback = Poster(), Fallback()
    delivery = ListenerDelivery(store, fallback, poster, default_channel=DEFAULT_CHANNEL)
    for run_id in (1, 2, 3, 4):
        await delivery.post_run(ticket(run_id, output=f"output {run_id}"))
    await delivery.post_run(ticket(9))  # a run the listener did not start
    assert [(r.kind, r.label, r.channel_id) for r in poster.results] == [
        ("review", "Call review", DEFAULT_CHANNEL), ("callback", "Elsewhere", OTHER_CHANNEL),
        ("callback", "Quiet", None), ("command", "book the table.", DEFAULT_CHANNEL)]
    assert all(r.card == card_reference(DEFAULT_CHANNEL, 99) for r in poster.results)
    assert [t.id for t in fallback.tickets] == [9]
    call = await Archive(store).show("call_5")
    assert call["review"] == "output 1" and call["review_status"] == "done"
    assert [j["delivered"] for j in call["jobs"]] == [f"posted in {DEFAULT_CHANNEL}", f"posted in {OTHER_CHANNEL}",
                                                      "posted in None", f"posted in {DEFAULT_CHANNEL}"]


async def test_a_result_that_lands_before_its_card_waits_and_the_card_brings_it_out(store):
    from bot.phone.delivery import WAITING
    from listener.pipeline import CallCard

    async with store.transaction() as conn:
        await conn.execute("UPDATE transcripts SET card = NULL")
    poster = Poster()
    delivery = ListenerDelivery(store, Fallback(), poster, default_channel=DEFAULT_CHANNEL)
    landed = ticket(4, output="booked")

    class Runs:  # the run as the runs service stored it
        async def get(self, run_id: int):
            return landed if run_id == 4 else None

    delivery._repo = Runs()
    await delivery.post_run(landed)
    assert poster.results == [] and (await Archive(store).show("call_5"))["jobs"][3]["delivered"] == WAITING
    card = CallCard(1, "call_5", "outbound", "+1", "+2", 10.0, None, 1, (), (("run-4", "command", "book"),))
    assert await delivery.post_card(card) == card_reference(DEFAULT_CHANNEL, 100)
    assert poster.results[0] == ("card", "call_5")
    (result,) = poster.results[1:]
    assert result.ticket.output == "booked" and result.card == card_reference(DEFAULT_CHANNEL, 100)


async def test_a_failed_review_is_recorded_and_a_failed_post_is_kept_not_raised(store):
    delivery = ListenerDelivery(store, Fallback(), Poster(fail=True), default_channel=DEFAULT_CHANNEL)
    await delivery.post_run(ticket(1, RunState.FAILED, output="", error="the agent crashed"))
    call = await Archive(store).show("call_5")
    assert call["review_status"] == "failed" and call["review"] == "the agent crashed"
    assert call["jobs"][0]["delivered"] == "post failed: Missing Access"


async def test_a_named_commands_token_is_revoked_when_its_run_lands(store):
    key = (await store.fetchone("SELECT dedupe_key FROM listener_jobs WHERE kind = 'command'"))["dedupe_key"]
    tokens = MutationTokens(store)
    token = await tokens.issue(key)
    assert await tokens.valid(token)
    await ListenerDelivery(store, Fallback(), Poster(), default_channel=None).post_run(ticket(4))
    assert not await tokens.valid(token)


async def test_the_terminal_poster_prints_cards_and_results(store, capsys):
    poster = TerminalPoster()
    await ListenerDelivery(store, Fallback(), poster, default_channel=None).post_run(ticket(2, output="filed it"))
    err = capsys.readouterr().err
    assert "callback \u201cElsewhere\u201d for call \"call_5\" finished" in err and "filed it" in err
    assert f"meant for Discord channel {OTHER_CHANNEL}" in err


async def test_reading_and_changing_what_runs_after_calls_is_the_operators_alone(store):
    gate = OperatorGate(frozenset({OPERATOR}))
    catalogue = ToolCatalogue(gate, transcript_tools(Archive(store), PhoneDataGate(gate, frozenset())))
    assert not catalogue.get("memory_search").mutating and catalogue.get("transcript_review_config").mutating

    async def run(name: str, args: dict, speakers: frozenset) -> dict:
        outcome = await catalogue.run(f"c-{name}", name, json.dumps(args), origin=Attribution("resp_1", 1, speakers),
                                      call=CallInfo("call-1", 1, 2))
        return {"ok": outcome.ok, **json.loads(outcome.output)}

    found = await run("transcript_search", {"query": "table"}, frozenset({OPERATOR}))
    assert found["ok"] and found["source_trust"] == "external-untrusted" and found["results"]
    assert "only an operator can read the phone calls" in (await run("transcript_search", {"query": "table"},
                                                                     frozenset({GUEST})))["error"]
    refused = await run("transcript_review_config", {"action": "clear"}, frozenset({GUEST}))
    assert not refused["ok"]
    assert (await Callbacks(store).review()) is not None  # nothing changed
    both = await run("transcript_review_config", {"action": "clear"}, frozenset({GUEST, OPERATOR}))
    assert not both["ok"] and (await Callbacks(store).review()) is not None
    done = await run("transcript_review_config", {"action": "register", "id": "crm", "name": "CRM",
                                                  "instructions": "Log the caller."}, frozenset({OPERATOR}))
    assert done["ok"] and done["callback"]["id"] == "crm"
    bad = await run("transcript_review_config", {"action": "register", "id": "x", "name": "X", "instructions": "y",
                                                 "deliver": "telegram"}, frozenset({OPERATOR}))
    assert "not one Switchboard knows" in bad["error"]


def test_a_card_fits_discord_whatever_the_call_holds_and_caller_text_stays_text():
    from bot.discord.phone_cards import card_embed
    from listener.pipeline import CallCard

    loud = "@everyone [click](https://evil.example) **now** <@123456789012345678> "
    card = CallCard(7, loud * 20, "inbound", "+1 555 " * 50, loud * 30, 1.0, 3600.0, 400,
                    tuple(loud * 5 for _ in range(40)), tuple((f"run-{i}", "callback", loud * 4) for i in range(60)))
    embed = card_embed(card)
    data = embed.to_dict()
    assert len(embed) <= 6000 and len(data["title"]) <= 256 and len(data["description"]) <= 4096
    assert all(len(f["value"]) <= 1024 and len(f["name"]) <= 256 for f in data["fields"])
    shown = str(data)
    assert "@everyone" not in shown.replace("@\u200beveryone", "") and "[click](" not in shown
    fields = {f["name"]: f["value"] for f in data["fields"]}
    assert fields["jobs"].split("\n")[-1].startswith("… and ") and fields["learned"].count("\n") >= 1


def test_a_token_never_survives_in_what_a_run_reports_even_cut_short_or_nested():
    from runs.core import ApprovalRequested, Finished, Progress
    from runs.service import _scrub

    token = "sbt_" + "A" * 32
    assert _scrub(Progress(f"terminal: switchboard callbacks register x --token {token[:20]}")).text.endswith(
        "--token [redacted]")  # a preview cut the token: still gone
    asked = _scrub(ApprovalRequested("r1", ("once", token), f"run with {token}?"))
    assert asked.choices == ("once", "[redacted]") and asked.description == "run with [redacted]?"
    done = _scrub(Finished(RunState.COMPLETED, output=f"used {token} and secret-xyz"), ("secret-xyz",))
    assert done.output == "used [redacted] and [redacted]"
    assert _scrub(Progress("nothing here")) == Progress("nothing here")


async def test_a_result_landing_while_another_process_records_the_card_is_posted_once_not_left_waiting(store, tmp_path, database_url):
    """The run lands in one process (no card recorded yet) while another posts and records the card:
    whatever the interleaving, the result is posted exactly once, under the card."""
    from bot.phone.delivery import WAITING
    from listener.pipeline import CallCard

    async with store.transaction() as conn:
        await conn.execute("UPDATE transcripts SET card = NULL")
    landed = ticket(4, output="booked")

    class Runs:  # the run as the runs service stored it
        async def get(self, run_id: int):
            return landed if run_id == 4 else None

    other = await open_store(tmp_path, STORE_MIGRATIONS, database_url=database_url)  # the other process: connections of its own
    card_poster, run_poster = Poster(), Poster()
    card_process = ListenerDelivery(other, Fallback(), card_poster, default_channel=DEFAULT_CHANNEL)
    card_process._repo = Runs()
    card = CallCard(1, "call_5", "outbound", "+1", "+2", 10.0, None, 1, (), (("run-4", "command", "book"),))

    class CardLandsNow:
        """This process's store: once it has read the run's job without a card, the other process
        posts and records the card just before this process acts on what it read — its second write
        (the first revokes the run's token)."""

        def __init__(self, real) -> None:
            self.real, self.saw_no_card, self.writes, self.interleaved = real, False, 0, False

        def __getattr__(self, name: str):
            return getattr(self.real, name)

        async def _card_lands(self) -> None:
            self.writes += self.saw_no_card
            if self.writes == 2 and not self.interleaved:
                self.interleaved = True
                await card_process.post_card(card)

        async def fetchone(self, sql: str, params=()):
            row = await self.real.fetchone(sql, params)
            self.saw_no_card |= "t.card" in sql and row is not None and row["card"] is None
            return row

        async def execute(self, sql: str, params=()):
            await self._card_lands()
            return await self.real.execute(sql, params)

        async def transact(self, body):
            await self._card_lands()
            return await self.real.transact(body)

    racing = CardLandsNow(store)
    run_process = ListenerDelivery(racing, Fallback(), run_poster, default_channel=DEFAULT_CHANNEL)
    run_process._repo = Runs()
    try:
        await run_process.post_run(landed)
        assert racing.interleaved
        posted = [r for r in card_poster.results + run_poster.results if not isinstance(r, tuple)]
        assert [r.ticket.output for r in posted] == ["booked"] and posted[0].card == card_reference(DEFAULT_CHANNEL, 100)
        delivered = (await Archive(store).show("call_5"))["jobs"][3]["delivered"]
        assert delivered == f"posted in {DEFAULT_CHANNEL}" and delivered != WAITING
        assert await card_process.flush_waiting() == 0 and await run_process.flush_waiting() == 0  # nothing twice
    finally:
        await other.close()


async def test_a_result_a_crashed_process_was_posting_is_posted_when_the_listener_starts(store):
    import subprocess
    import sys

    from bot.phone.delivery import POSTING

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = f"{__import__('socket').gethostname()}:{child.pid}:?:x"  # posting, then the process died
    await store.execute("UPDATE listener_jobs SET delivered = ? WHERE job_id = 'run-2'", (POSTING + gone,))
    await store.execute("UPDATE listener_jobs SET delivered = ? WHERE job_id = 'run-3'", ("posted in None",))
    poster = Poster()
    delivery = ListenerDelivery(store, Fallback(), poster, default_channel=DEFAULT_CHANNEL)

    class Runs:
        async def get(self, run_id: int):
            return ticket(run_id, output=f"output {run_id}")

    delivery._repo = Runs()
    assert await delivery.flush_waiting() == 1
    assert [r.label for r in poster.results] == ["Elsewhere"]  # run-2 again; run-3 was posted already
    assert await delivery.flush_waiting() == 0


async def test_two_processes_flushing_the_same_waiting_results_post_each_once(store, tmp_path, database_url):
    import subprocess
    import sys

    from bot.phone.delivery import WAITING
    from runs.procs import process_token

    await store.execute("UPDATE listener_jobs SET delivered = ?", (WAITING,))
    other = await open_store(tmp_path, STORE_MIGRATIONS, database_url=database_url)
    # two live processes own the two deliveries (so neither takes the other's result as abandoned)
    lives = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
             for _ in range(2)]
    host = __import__("socket").gethostname()

    class Runs:
        async def get(self, run_id: int):
            return ticket(run_id, output=f"output {run_id}")

    posters = [Poster(), Poster()]
    deliveries = [ListenerDelivery(db, Fallback(), poster, default_channel=DEFAULT_CHANNEL,
                                   owner=f"{host}:{process_token(life.pid)}:x")
                  for db, poster, life in zip((store, other), posters, lives, strict=True)]
    for delivery in deliveries:
        delivery._repo = Runs()
    try:
        counts = await asyncio.wait_for(asyncio.gather(*(d.flush_waiting() for d in deliveries)), 10)
        labels = sorted(r.label for poster in posters for r in poster.results)
        assert labels == ["Call review", "Elsewhere", "Quiet", "book the table."] and sum(counts) == 4
    finally:
        for life in lives:
            life.stdin.close()
            life.wait()
        await other.close()
