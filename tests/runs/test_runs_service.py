"""The runs service end to end over real parts: a SQLite file, the fake api_server on loopback, real
agent subprocesses; time is virtual, calls and the sink record what they were given."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal

import pytest

from common.redact import encoded_forms
from runs import (
    Delivery,
    Refused,
    RunsConfig,
    RunState,
    SteerState,
    StopOutcome,
    UnknownRun,
)
from runs.core import TERMINAL
from runs.lanes.hermes_api import UNCONFIRMED
from tests.support.clock import VirtualClock
from tests.support.fake_hermes import STEER_FEATURES, FakeHermes
from tests.support.runs import (
    KEY,
    SAFETY_S,
    Harness,
    ProcessWatch,
    RecordingCall,
    accepted,
    agent_command,
    harness,
    read_fifo,
)
from tests.support.store import read_elsewhere

# -- delegating ------------------------------------------------------------------------------------

async def test_delegate_answers_before_a_slow_lane_accepts_and_the_ticket_is_committed_first(tmp_path, database_url):
    async with FakeHermes(key=KEY) as fake, harness(tmp_path, fake=fake, database_url=database_url) as h:
        gate = fake.hold_submissions()
        receipt = await h.service.delegate("audit the auth module", requester_id=111)
        assert receipt.summary.startswith("run 1 is starting on hermes-api")
        assert receipt.state is RunState.STARTING
        await asyncio.wait_for(fake.submission_held.wait(), SAFETY_S)
        # the lane is being asked right now: the ticket is already on disk, as another process sees it
        (row,) = await read_elsewhere(tmp_path / "home", database_url,
                                      "SELECT state, lane, requester_id, idempotency_key FROM runs")
        assert tuple(row[:3]) == ("starting", "hermes-api", 111)
        assert row[3].startswith("switchboard-")  # our own key: Hermes ignores Idempotency-Key
        assert (await h.service.check(1)).ticket.state is RunState.STARTING
        gate.set()
        run = await accepted(h, 1)
        assert run.state is RunState.RUNNING and run.external_id == fake.only_run().run_id
        fake.assert_clean()


async def test_a_finished_run_is_announced_in_every_call_posted_and_delivered_once(tmp_path, database_url):
    async with FakeHermes(key=KEY, features=STEER_FEATURES) as fake, harness(tmp_path, fake=fake, database_url=database_url) as h:
        second = RecordingCall()
        detach = h.service.attach(second)
        await h.service.delegate("audit the auth module")
        run = await accepted(h, 1)
        await asyncio.wait_for(fake.runs[run.external_id].stream_open.wait(), SAFETY_S)
        fake.progress(run.external_id, "web_search", "token refresh")
        await h.until(1, lambda t: t.progress is not None)
        check = await h.service.check(1)
        assert check.ticket.progress == "using web_search: token refresh" and check.can_steer
        fake.complete(run.external_id, "Three gaps, starting with the token refresh swallowing exceptions.")
        done = await h.delivered(1)
        assert done.state is RunState.COMPLETED and done.announced is True
        expected = ("Run 1 (audit the auth module) finished: Three gaps, starting with the token refresh "
                    "swallowing exceptions.")
        assert h.call.said == [expected] and second.said == [expected]
        assert [t.id for t in h.sink.posted] == [1] and h.sink.posted[0].output.startswith("Three gaps")
        # a second delivery attempt finds it claimed and says nothing
        await h.service._deliver(1)
        assert h.call.said == [expected] and len(h.sink.posted) == 1
        detach()
        fake.assert_clean()


async def test_a_run_whose_call_ended_is_still_posted_and_stays_visible_in_check_work(tmp_path, database_url):
    async with FakeHermes(key=KEY) as fake, harness(tmp_path, fake=fake, attach=False, database_url=database_url) as h:
        gone = RecordingCall(spoken=False)  # the call ended before it could speak
        h.service.attach(gone)
        await h.service.delegate("summarise the changelog")
        run = await accepted(h, 1)
        fake.complete(run.external_id, "v2 adds retries")
        done = await h.delivered(1)
        assert done.announced is False and [t.id for t in h.sink.posted] == [1]
        overview = await h.service.check()
        assert overview.finished[0].view()["heard"] == "not announced in a call yet"
        detail = await h.service.check(1)
        assert detail.ticket.output == "v2 adds retries" and detail.ticket.state is RunState.COMPLETED


async def test_every_fall_through_is_said_out_loud(tmp_path, database_url):
    async with harness(tmp_path, database_url=database_url) as h:  # nothing listens on the hermes-api address
        receipt = await h.service.delegate("tidy the README")
        assert receipt.summary.startswith("hermes-api is not running, so run 1 is starting on the command lane")
        assert "API_SERVER_ENABLED=true" in receipt.skipped[0]
        done = await h.delivered(1)
        assert done.lane == "command" and done.output.strip() == "answer: tidy the README"


async def test_a_rejected_key_is_said_as_such_when_falling_through(tmp_path, database_url):
    async with FakeHermes(key="the-real-key") as fake, harness(tmp_path, fake=fake, database_url=database_url) as h:
        fake.expect_violation()
        receipt = await h.service.delegate("tidy the README")
        assert receipt.summary.startswith("hermes-api is running but rejected my key, so run 1")
        fake.assert_clean()


async def test_no_lane_available_is_a_refusal_naming_each_lane_and_how_to_enable_it(tmp_path, database_url):
    async with harness(tmp_path, command=("no-such-agent-binary-xyz", "-z", "{task}"), database_url=database_url) as h:
        refusal = await h.service.delegate("do things")
        assert isinstance(refusal, Refused) and "nothing was started" in refusal.reason
        assert "hermes-api: hermes-api is not running" in refusal.reason
        assert "API_SERVER_ENABLED=true" in refusal.reason and "API_SERVER_KEY" in refusal.reason
        assert "command: `no-such-agent-binary-xyz` was not found" in refusal.reason
        assert "SWITCHBOARD_AGENT_COMMAND" in refusal.reason
        assert await h.service.tickets() == []


async def test_an_empty_task_is_refused_without_a_ticket(tmp_path, database_url):
    async with harness(tmp_path, database_url=database_url) as h:
        assert isinstance(await h.service.delegate("   "), Refused)
        assert await h.service.tickets() == []


# -- approvals -------------------------------------------------------------------------------------

async def test_an_approval_question_is_spoken_and_answered_for_the_session(tmp_path, database_url):
    async with FakeHermes(key=KEY) as fake, harness(tmp_path, fake=fake, database_url=database_url) as h:
        await h.service.delegate("clean the build directory")
        run = await accepted(h, 1)
        await asyncio.wait_for(fake.runs[run.external_id].stream_open.wait(), SAFETY_S)
        fake.request_approval(run.external_id, description="run `rm -rf build/`")
        question = await asyncio.wait_for(h.call.wait_said("asks for permission"), SAFETY_S)
        assert "rm -rf build/" in question and "always" not in question
        waiting = await h.until(1, lambda t: t.state is RunState.WAITING_FOR_APPROVAL)
        assert waiting.approval.request_id is None  # 0.19.0 names no request
        refused = await h.service.resolve_approval(1, "always")
        assert "never" in refused.reason
        answer = await h.service.resolve_approval(1, "session", requester_id=111)
        assert answer.summary == "told run 1: approve for this session" and answer.choice == "session"
        assert fake.runs[run.external_id].answers == [{"choice": "session"}]
        assert (await h.until(1, lambda t: t.state is RunState.RUNNING)).approval is None
        again = await h.service.resolve_approval(1, "once")
        assert "not waiting" in again.reason
        fake.assert_clean()


async def test_an_unanswered_question_is_denied_when_its_time_is_up(tmp_path, database_url):
    async with FakeHermes(key=KEY) as fake, harness(tmp_path, fake=fake, approval_timeout_s=90, database_url=database_url) as h:
        await h.service.delegate("deploy the site")
        run = await accepted(h, 1)
        await asyncio.wait_for(fake.runs[run.external_id].stream_open.wait(), SAFETY_S)
        fake.request_approval(run.external_id, choices=("once", "deny"))
        await h.until(1, lambda t: t.state is RunState.WAITING_FOR_APPROVAL)
        await h.vt.wait_sleeper(lambda d: d == 90)
        h.vt.advance(89)
        await asyncio.sleep(0)
        assert fake.runs[run.external_id].answers == []
        h.vt.advance(1)
        await asyncio.wait_for(h.call.wait_said("so I denied it"), SAFETY_S)
        assert fake.runs[run.external_id].answers == [{"choice": "deny"}]
        assert (await h.until(1, lambda t: t.state is RunState.RUNNING)).approval is None
        fake.assert_clean()


async def test_the_automatic_deny_is_said_even_when_the_stream_reports_the_answer_first(tmp_path):
    """Answering makes Hermes send `approval.responded` on the run's stream; when that report lands
    before the timer's own (a slower store), it must not cancel the timer before it says so."""
    async with FakeHermes(key=KEY) as fake, harness(tmp_path, fake=fake, approval_timeout_s=90) as h:
        lane = h.service.lanes["hermes-api"]
        answer = lane.answer

        async def answer_then_let_the_stream_win(ticket, request_id, choice):
            await answer(ticket, request_id, choice)
            await h.until(ticket.id, lambda t: t.state is RunState.RUNNING)  # the stream's report is stored

        lane.answer = answer_then_let_the_stream_win
        await h.service.delegate("deploy the site")
        run = await accepted(h, 1)
        await asyncio.wait_for(fake.runs[run.external_id].stream_open.wait(), SAFETY_S)
        fake.request_approval(run.external_id, choices=("once", "deny"))
        await h.until(1, lambda t: t.state is RunState.WAITING_FOR_APPROVAL)
        await h.vt.wait_sleeper(lambda d: d == 90)
        h.vt.advance(90)
        await asyncio.wait_for(h.call.wait_said("so I denied it"), SAFETY_S)
        assert fake.runs[run.external_id].answers == [{"choice": "deny"}]


async def test_a_choice_the_question_does_not_offer_is_refused(tmp_path, database_url):
    async with FakeHermes(key=KEY) as fake, harness(tmp_path, fake=fake, database_url=database_url) as h:
        await h.service.delegate("deploy the site")
        run = await accepted(h, 1)
        await asyncio.wait_for(fake.runs[run.external_id].stream_open.wait(), SAFETY_S)
        fake.request_approval(run.external_id, choices=("once", "deny"))
        await h.until(1, lambda t: t.state is RunState.WAITING_FOR_APPROVAL)
        assert "allows only once, deny" in (await h.service.resolve_approval(1, "session")).reason
        assert fake.runs[run.external_id].answers == []


# -- steering --------------------------------------------------------------------------------------

async def test_a_note_is_queued_then_landed_only_when_the_lane_shows_it_consumed(tmp_path, database_url):
    async with FakeHermes(key=KEY, features=STEER_FEATURES) as fake, harness(tmp_path, fake=fake, database_url=database_url) as h:
        await h.service.delegate("audit the auth module")
        run = await accepted(h, 1)
        await asyncio.wait_for(fake.runs[run.external_id].stream_open.wait(), SAFETY_S)
        answer = await h.service.steer(1, "focus on the token refresh", requester_id=111)
        assert answer.receipt.state is SteerState.QUEUED and "not yet shown to be read" in answer.summary
        sent = fake.runs[run.external_id].steers[0]
        assert sent.endswith("] focus on the token refresh") and sent.startswith("[sb-")
        # run.steered arrives (the server's own acknowledgement): still only queued
        notes = await h.notes(1, lambda rs: rs and rs[0].seen_pending)
        assert notes[0].state is SteerState.QUEUED
        assert (await h.service.check(1)).receipts[0].state is SteerState.QUEUED
        fake.consume_steer(run.external_id)
        notes = await h.notes(1, lambda rs: rs[0].state is not SteerState.QUEUED)
        assert notes[0].state is SteerState.LANDED
        view = (await h.service.check(1)).view()["notes"][0]
        assert view["state"] == "landed" and "consumed" in view["meaning"]
        fake.complete(run.external_id, "done")
        await h.delivered(1)
        assert (await h.service.repo.receipts(1))[0].state is SteerState.LANDED
        fake.assert_clean()


async def test_a_note_never_shown_consumed_is_unconfirmed_when_the_run_completes(tmp_path, database_url):
    async with FakeHermes(key=KEY, features=STEER_FEATURES) as fake, harness(tmp_path, fake=fake, database_url=database_url) as h:
        await h.service.delegate("audit the auth module")
        run = await accepted(h, 1)
        await asyncio.wait_for(fake.runs[run.external_id].stream_open.wait(), SAFETY_S)
        await h.service.steer(1, "also check logging")
        fake.complete(run.external_id, "done", leave_pending=True)  # the final status still lists it
        await h.delivered(1)
        notes = await h.notes(1, lambda rs: rs[0].state is not SteerState.QUEUED)
        assert notes[0].state is SteerState.UNCONFIRMED
        assert "without any proof" in (await h.service.check(1)).view()["notes"][0]["meaning"]


async def test_stopping_supersedes_queued_notes_and_the_run_ends_cancelled(tmp_path, database_url):
    async with FakeHermes(key=KEY, features=STEER_FEATURES) as fake, harness(tmp_path, fake=fake, database_url=database_url) as h:
        await h.service.delegate("audit the auth module")
        run = await accepted(h, 1)
        await asyncio.wait_for(fake.runs[run.external_id].stream_open.wait(), SAFETY_S)
        await h.service.steer(1, "also check logging")
        stopped = await h.service.stop(1, "wrong repo", requester_id=111)
        assert stopped.summary == "stopping run 1 (hermes-api says stopping)"
        assert stopped.outcome is StopOutcome.STOPPING and stopped.superseded == 1
        done = await h.delivered(1)
        assert done.state is RunState.CANCELLED and done.stop.by == 111 and done.error == "stopped: wrong repo"
        assert h.call.said == ["Run 1 (audit the auth module) was stopped."]
        assert (await h.service.repo.receipts(1))[0].state is SteerState.SUPERSEDED
        assert (await h.service.stop(1)).summary == "run 1 already stopped"
        assert "cannot reach it" in (await h.service.steer(1, "late")).reason
        fake.assert_clean()


async def test_a_stop_before_the_lane_accepted_is_carried_out_when_it_does(tmp_path, database_url):
    async with FakeHermes(key=KEY) as fake, harness(tmp_path, fake=fake, database_url=database_url) as h:
        gate = fake.hold_submissions()
        await h.service.delegate("audit the auth module")
        await asyncio.wait_for(fake.submission_held.wait(), SAFETY_S)
        answer = await h.service.stop(1)
        assert answer.summary == "run 1 will be stopped as soon as hermes-api accepts it"
        gate.set()
        done = await h.delivered(1)
        assert done.state is RunState.CANCELLED
        assert any(r["path"].endswith("/stop") for r in fake.requests)


async def test_command_runs_cannot_take_notes_but_can_be_stopped_with_their_process_group(tmp_path, database_url):
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    async with harness(tmp_path, lanes=("command",), command=agent_command("hang", "--ready", str(fifo)), database_url=database_url) as h:
        await h.service.delegate("watch the logs")
        leader, child = (int(p) for p in (await read_fifo(fifo)).split())
        watches = [ProcessWatch(leader), ProcessWatch(child)]
        await accepted(h, 1)
        refusal = await h.service.steer(1, "look at nginx too")
        assert "no way to pass a note" in refusal.reason and "stop it instead" in refusal.reason and refusal.can_stop
        agents = await h.service.list_agents()
        assert not agents.runs[0].can_steer
        assert (await h.service.stop(1)).outcome is StopOutcome.STOPPING
        done = await h.delivered(1)
        assert done.state is RunState.CANCELLED
        for watch in watches:
            await watch.exited()


async def test_list_agents_marks_what_can_be_steered(tmp_path, database_url):
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    async with FakeHermes(key=KEY, features=STEER_FEATURES) as fake, harness(
            tmp_path, fake=fake, command=agent_command("hang", "--ready", str(fifo)), database_url=database_url) as h:
        await h.service.delegate("audit the auth module")
        api_run = await accepted(h, 1)
        h.service.config = RunsConfig(lanes=("command",), command=h.service.config.command)
        await h.service.delegate("watch the logs")
        await read_fifo(fifo)
        await accepted(h, 2)
        agents = await h.service.list_agents()
        assert [(a.ticket.id, a.ticket.lane, a.can_steer) for a in agents.runs] == [
            (1, "hermes-api", True), (2, "command", False)]
        assert agents.summary == "run 1 on hermes-api (steer or stop); run 2 on command (stop only)"
        await h.service.stop(2)
        fake.complete(api_run.external_id, "ok")
        await h.delivered(1)
        await h.delivered(2)
        assert (await h.service.list_agents()).runs == ()


async def test_a_run_past_its_budget_is_stopped_and_failed(tmp_path, database_url):
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    async with harness(tmp_path, lanes=("command",), timeout_s=1800,
                       command=agent_command("hang", "--ready", str(fifo)), database_url=database_url) as h:
        await h.service.delegate("watch the logs")
        leader, _ = (int(p) for p in (await read_fifo(fifo)).split())
        watch = ProcessWatch(leader)
        await accepted(h, 1)
        await h.vt.wait_sleeper(lambda d: d == 1800)
        h.vt.advance(1800)
        done = await h.delivered(1)
        assert done.state is RunState.FAILED and done.error == "it ran past its 30 minutes budget"
        assert h.call.said == ["Run 1 (watch the logs) failed: it ran past its 30 minutes budget"]
        await watch.exited()


async def test_a_failing_command_reports_its_error(tmp_path, database_url):
    async with harness(tmp_path, lanes=("command",), command=agent_command("fail"), database_url=database_url) as h:
        await h.service.delegate("do the impossible")
        done = await h.delivered(1)
        assert done.state is RunState.FAILED and "the model refused the task" in done.error
        assert "failed: `" in h.call.said[0]
        assert (await h.service.check(1)).ticket.error.startswith("`")


# -- restart recovery ------------------------------------------------------------------------------

async def test_a_restart_reconciles_every_run_the_crashed_instance_left(tmp_path, database_url):
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    hang = agent_command("hang", "--ready", str(fifo))
    async with FakeHermes(key=KEY) as fake:
        vt = VirtualClock(1_750_000_000.0)
        async with harness(tmp_path, fake=fake, vt=vt, command=hang, owner="old-host:1:1:dead",
                           crash=True, database_url=database_url) as first:
            for task in ("finishes meanwhile", "fails meanwhile", "still going"):
                await first.service.delegate(task)
            runs = [await accepted(first, n) for n in (1, 2, 3)]
            first.service.config = RunsConfig(lanes=("command",), command=hang)
            await first.service.delegate("a detached command")
            leader = ProcessWatch(int((await read_fifo(fifo)).split()[0]))
            command_run = await accepted(first, 4)
            # recorded, but the process died before the lane was asked
            unsent = await first.service.repo.create(lane="hermes-api", task="never submitted", requester_id=None,
                                                     owner="old-host:1:1:dead", idempotency_key="switchboard-unsent",
                                                     now=vt.clock())
        # the first instance is gone without finishing anything; meanwhile on Hermes:
        fake.set_status(runs[0].external_id, "completed", output="it finished")
        fake.set_status(runs[1].external_id, "failed", error="out of credits")
        before = fake.submissions

        async with harness(tmp_path, fake=fake, vt=vt, command=hang, database_url=database_url) as second:
            assert (await second.service.get(1)).state is RunState.COMPLETED
            assert (await second.service.get(2)).state is RunState.FAILED
            lost = await second.service.get(4)
            assert lost.state is RunState.LOST and "cannot be re-attached" in lost.error
            assert "still runs" in lost.error
            still = await second.service.get(3)
            assert still.state is RunState.RUNNING and still.owner == second.service.owner
            # Hermes may have it (it ignores idempotency keys): never sent again, said as unknown
            unknown = await second.service.get(unsent.id)
            assert unknown.state is RunState.LOST and unknown.error == UNCONFIRMED and fake.submissions == before
            for n in (1, 2, 4, unsent.id):
                await second.delivered(n)
            assert {t.id for t in second.sink.posted} == {1, 2, 4, unsent.id}
            assert "Run 1 (finishes meanwhile) finished: it finished" in second.call.said
            # the one still going is followed again (its stream is gone: by status) until it ends
            await second.vt.wait_sleeper(lambda d: d == 5)
            fake.set_status(runs[2].external_id, "completed", output="late but done")
            second.vt.advance(5)
            done = await second.delivered(3)
            assert done.output == "late but done"
            events = [e.kind for e in await second.service.repo.events(3)]
            assert "reconcile" in events
        os.killpg(int(command_run.external_id.split(":")[0]), signal.SIGKILL)  # a lost run is not stopped
        await leader.exited()
        fake.assert_clean()


async def test_a_claim_left_by_a_dead_deliverer_is_delivered_again(tmp_path, database_url):
    async with harness(tmp_path, lanes=("command",), owner="old-host:1:1:dead", crash=True, database_url=database_url) as first:
        await first.service.delegate("quick one")
        await first.delivered(1)
        # simulate: claimed, then the process died before announcing
        await first.service.store.execute("UPDATE runs SET delivery = 'claimed', delivery_owner = ?, "
                                          "announced = NULL WHERE id = 1", (first.service.owner,))
    async with harness(tmp_path, lanes=("command",), database_url=database_url) as second:
        done = await second.delivered(1)
        assert done.announced is True and len(second.call.said) == 1


async def test_a_run_that_finished_while_the_service_was_down_waits_for_the_rejoined_call_then_is_announced(tmp_path, database_url):
    async with harness(tmp_path, lanes=("command",), owner="old-host:1:1:dead", crash=True, database_url=database_url) as first:
        await first.service.delegate("quick one")
        await first.delivered(1)
        await first.service.store.execute("UPDATE runs SET delivery = 'claimed', delivery_owner = ?, "
                                          "announced = NULL WHERE id = 1", (first.service.owner,))
    async with harness(tmp_path, lanes=("command",), attach=False, hold_delivery_s=3600, database_url=database_url) as second:
        await asyncio.wait_for(second.service.wait_held(1), SAFETY_S)  # waiting for the release
        assert (await second.service.get(1)).delivery is not Delivery.DELIVERED and not second.sink.posted
        second.service.attach(second.call)  # the call is back
        second.service.release_delivery()
        done = await second.delivered(1)
        assert done.announced is True and len(second.call.said) == 1 and [t.id for t in second.sink.posted] == [1]


async def test_check_work_without_a_number_summarises_what_runs_and_what_landed(tmp_path, database_url):
    async with FakeHermes(key=KEY) as fake, harness(tmp_path, fake=fake, database_url=database_url) as h:
        assert (await h.service.check()).summary == "no background runs yet"
        await h.service.delegate("first")
        first = await accepted(h, 1)
        fake.complete(first.external_id, "x" * 5000)
        await h.delivered(1)
        await h.service.delegate("second")
        await accepted(h, 2)
        overview = await h.service.check()
        assert overview.summary.startswith("run 2 is running on hermes-api")
        assert "recently: run 1 finished" in overview.summary
        detail = (await h.service.check(1)).view()
        assert len(detail["output"]) <= 1502 and "switchboard runs show 1" in detail["output_note"]
        with pytest.raises(LookupError):
            await h.service.check(99)
        assert {t.state for t in await h.service.tickets()} <= set(TERMINAL) | {RunState.RUNNING}


# -- secrets never leave in what a run reports -----------------------------------------------------

# What the composition root hands the service: every key and token the process holds.
PROCESS_SECRETS = {
    "discord": "MTA5ODc2NTQzMjEwOTg3NjU0.GaBcDe.discord-token-0123456789abcdefXYZ",
    "listener": "sn-listener-key-NEVER-IN-A-RUN-0123456789",
    "openai": "sk-proj-openai-key-NEVER-IN-A-RUN-0123456789",
    "xai": "xai-key-NEVER-IN-A-RUN-0123456789abcdef",
    "text": "sk-text-model-key-NEVER-IN-A-RUN-012345",
}
RUN_SECRET = "run-own-secret-9f8e7d6c5b4a39281706"  # a run's token, shaped like no other


def pieces(secret: str, n: int = 8) -> list[str]:
    return [secret[i:i + n] for i in range(len(secret) - n + 1)]


def leaked(text: str | None, *secrets: str) -> list[str]:
    """Every run of 8 characters of a secret found in `text` (a cut-short secret still leaks)."""
    return [piece for secret in secrets for piece in pieces(secret) if text and piece in text]


async def everything_reported(h: Harness, run_id: int) -> str:
    """All a run left behind: its ticket and events in the store, what was posted, said and answered."""
    ticket = await h.service.get(run_id)
    events = await h.service.repo.events(run_id)
    posted = [t for t in h.sink.posted if t.id == run_id]
    return "\n".join([repr(ticket), *(repr(e) for e in events), *(repr(t) for t in posted), *h.call.said,
                      *(repr(answer) + repr(answer.as_tool_output())
                        for answer in (await h.service.check(run_id), await h.service.check()))])


async def test_every_secret_the_process_holds_is_scrubbed_from_what_a_run_stores_says_and_posts(tmp_path, database_url):
    secrets = (*PROCESS_SECRETS.values(), KEY)  # KEY: the Hermes key from the config, added by the service
    async with harness(tmp_path, lanes=("command",), secrets=tuple(PROCESS_SECRETS.values()), database_url=database_url) as h:
        await h.service.delegate(f"check the config; the old key was {PROCESS_SECRETS['openai']}",
                                 context="Your environment: " + " ".join(secrets))
        done = await h.delivered(1)
        assert done.state is RunState.COMPLETED and "Your environment: [redacted]" in done.output
        assert done.task == "check the config; the old key was [redacted]"  # what is stored and shown
        assert leaked(await everything_reported(h, 1), *secrets) == []


async def test_a_secret_cut_short_by_the_output_cap_is_scrubbed_from_both_ends_of_the_cut(tmp_path, database_url):
    """The cap keeps the head and the tail: the head ends with the first 14 characters of the run's own
    secret, the tail starts 12 characters into the Discord token; neither piece survives."""
    discord = PROCESS_SECRETS["discord"]
    tail = 192 - (len(discord) - 12) - 1  # a 256-byte cap keeps a 192-byte tail, ending with print's newline
    context = RUN_SECRET + "B" * 500 + discord + "C" * tail
    async with harness(tmp_path, lanes=("command",), output_cap_bytes=256, secrets=(discord,), database_url=database_url) as h:
        await h.service.delegate("A" * 40, context=context, scrub=(RUN_SECRET,))  # "answer: " + 40 + 2 = 50
        done = await h.delivered(1)
        assert done.output_cut and done.output.startswith("answer: " + "A" * 40)
        head, _, rest = done.output.partition("\n[…")
        assert head.endswith("[redacted]") and rest.split("\n", 1)[1].startswith("[redacted]" + "C" * tail)
        assert leaked(await everything_reported(h, 1), RUN_SECRET, discord) == []


async def test_a_runs_own_secret_is_scrubbed_from_its_final_report(tmp_path, database_url):
    async with harness(tmp_path, lanes=("command",), database_url=database_url) as h:
        await h.service.delegate("use the token you were given", context=f"token: {RUN_SECRET}",
                                 scrub=(RUN_SECRET,))
        done = await h.delivered(1)
        assert done.output.strip().endswith("token: [redacted]")
        assert leaked(await everything_reported(h, 1), RUN_SECRET) == []
        # another run is not given that secret's scrubbing, and needs none
        await h.service.delegate("say hello")
        assert (await h.delivered(2)).output.strip() == "answer: say hello"


async def test_a_mutation_token_with_dashes_and_underscores_is_scrubbed_whole_even_unannounced(tmp_path, database_url):
    token = "sbt_kZ3-9q_Xw-Pm_77-aB_cD-eF_gH-iJ_kL"  # the URL-safe alphabet: - and _ inside
    async with harness(tmp_path, lanes=("command",), database_url=database_url) as h:
        await h.service.delegate(f"switchboard callbacks register x --token {token} && done")
        done = await h.delivered(1)
        assert done.output.strip() == "answer: switchboard callbacks register x --token [redacted] && done"
        assert leaked(await everything_reported(h, 1), token) == []


async def test_secrets_are_scrubbed_from_hermes_progress_cut_short_and_its_final_report(tmp_path, database_url):
    secrets = (*PROCESS_SECRETS.values(), KEY, RUN_SECRET)
    async with FakeHermes(key=KEY) as fake, harness(tmp_path, fake=fake,
                                                     secrets=tuple(PROCESS_SECRETS.values()), database_url=database_url) as h:
        await h.service.delegate("audit the deploy", context=f"token {RUN_SECRET}", scrub=(RUN_SECRET,))
        run = await accepted(h, 1)
        assert fake.runs[run.external_id].input.endswith(f"token {RUN_SECRET}")  # the agent got it
        await asyncio.wait_for(fake.runs[run.external_id].stream_open.wait(), SAFETY_S)
        # a preview is cut at 120 characters: it ends 20 characters into the Discord token
        fake.progress(run.external_id, "terminal", "x" * 100 + PROCESS_SECRETS["discord"])
        progressed = await h.until(1, lambda t: t.progress is not None)
        assert progressed.progress == "using terminal: " + "x" * 100 + "[redacted]"
        fake.progress(run.external_id, "terminal", f"export OPENAI_API_KEY={PROCESS_SECRETS['openai']}")
        await h.until(1, lambda t: "export" in (t.progress or ""))
        fake.complete(run.external_id, f"Done. Used {RUN_SECRET}, {KEY} and {PROCESS_SECRETS['listener'][:-5]}")
        done = await h.delivered(1)
        assert done.output == "Done. Used [redacted], [redacted] and [redacted]"
        assert leaked(await everything_reported(h, 1), *secrets) == []
        fake.assert_clean()


async def test_a_secret_learned_while_a_run_is_going_is_scrubbed_from_its_report(tmp_path, database_url):
    rotated = "sn-rotated-listener-key-0123456789abcdef"  # the listener key, read again after a rotation
    go = tmp_path / "go"
    async with harness(tmp_path, lanes=("command",), command=agent_command("answer", "--wait-for", str(go)), database_url=database_url) as h:
        await h.service.delegate("report", context=f"keys {rotated} {RUN_SECRET}", scrub=(RUN_SECRET,))
        await accepted(h, 1)  # already reported on: its scrubber exists
        h.service.add_secrets([rotated, None, ""])
        go.touch()
        done = await h.delivered(1)
        assert done.output.strip() == "answer: report\n\nkeys [redacted] [redacted]"
        assert leaked(await everything_reported(h, 1), rotated, RUN_SECRET) == []


async def test_the_agent_the_service_starts_never_gets_a_variable_carrying_a_secret_of_the_process(tmp_path,
                                                                                                monkeypatch, database_url):
    monkeypatch.setenv("HERMES_SHARED_KEY", PROCESS_SECRETS["openai"])  # an allow-listed name, a bot key inside
    monkeypatch.setenv("HERMES_GATEWAY_KEY", KEY)  # the Hermes key the service was configured with
    monkeypatch.setenv("HERMES_MODEL_HINT", "gpt-5")
    async with harness(tmp_path, lanes=("command",), secrets=tuple(PROCESS_SECRETS.values()), database_url=database_url) as h:
        env = h.service.lanes["command"].environment()
        assert env["HERMES_MODEL_HINT"] == "gpt-5"
        assert "HERMES_SHARED_KEY" not in env and "HERMES_GATEWAY_KEY" not in env


async def test_a_huge_or_negative_run_number_from_a_model_is_no_such_run_not_an_overflow(tmp_path, database_url):
    async with harness(tmp_path, lanes=("command",), database_url=database_url) as h:
        for number in ("99999999999999999999999", "-1", "0", "#18446744073709551616"):
            with pytest.raises(UnknownRun):
                await h.service.get(number)
            with pytest.raises(UnknownRun):
                await h.service.stop(number, "why not")


@pytest.mark.parametrize("encoder", ["base64", "basenc --base64url", "xxd -p"])
async def test_an_agent_that_prints_an_encoded_env_file_has_every_secret_scrubbed(tmp_path, encoder):
    """`cat .env | base64` through the real command lane and the service: what is stored, posted and
    said holds none of the process's secrets in the encodings the scrubber knows."""
    if shutil.which(encoder.split()[0]) is None:
        pytest.skip(f"{encoder.split()[0]} is not installed")
    env_file = tmp_path / "switchboard.env"
    env_file.write_text("".join(f"{name.upper()}_KEY={value}\n" for name, value in PROCESS_SECRETS.items()))
    agent = ("/bin/sh", "-c", f'{encoder} < "$1"', "agent", "{task}")
    async with harness(tmp_path, lanes=("command",), command=agent, secrets=tuple(PROCESS_SECRETS.values())) as h:
        await h.service.delegate(str(env_file))
        done = await h.delivered(1)
        reported = await everything_reported(h, 1)
    assert done.state is RunState.COMPLETED and "[redacted]" in done.output
    joined = reported.replace("\n", "").replace("\\n", "")  # the encoders wrap their lines
    for secret in PROCESS_SECRETS.values():
        assert [form for form in encoded_forms(secret) if form[:12] in joined] == [], secret
