"""The hermes-api lane against the real Hermes Agent 0.19.0 api_server (`hermes gateway run`).

One gateway serves the tests of the `hermes_real` group (they run one after another on one worker);
the tests that kill or restart a gateway start their own (group `hermes_real_restarts`, another worker).
The gateway thinks with `FakeAgentModel`, driven by markers in each task.
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from runs.config import RunsConfig
from runs.core import ApprovalRequested, Finished, Progress, Running, RunState, RunTicket
from runs.hermes_wire import DEFAULT_APPROVAL_CHOICES, HERMES_LOST, HERMES_STOPPED
from runs.lanes import AlreadyEnded, HermesApiLane
from runs.lanes.hermes_api import QUIET_S
from tests.support.clock import VirtualClock
from tests.support.fake_agent_model import FakeAgentModel, long_answer
from tests.support.real_hermes import REAL_KEY, RealHermes
from tests.support.runs import SAFETY_S, accepted, harness

SHARED = pytest.mark.xdist_group("hermes_real")
RESTARTS = pytest.mark.xdist_group("hermes_real_restarts")
SLOW_S = 60.0  # a hang guard for a real agent turn on a loaded machine; nothing is timed


@pytest.fixture(scope="session")
def shared_hermes(tmp_path_factory):
    with FakeAgentModel() as model:
        gateway = RealHermes(model, tmp_path_factory.mktemp("hermes")).start()
        try:
            yield model, gateway
        finally:
            gateway.stop()


@pytest.fixture
def own_hermes(tmp_path):
    with FakeAgentModel() as model:
        gateway = RealHermes(model, tmp_path / "hermes").start()
        try:
            yield model, gateway
        finally:
            gateway.stop()


def real(gateway: RealHermes, tmp_path, **kw):
    return harness(tmp_path, fake=gateway, lanes=("hermes-api",), hermes_key=REAL_KEY, **kw)


async def until(h, run_id, predicate):
    return await asyncio.wait_for(h.service.wait_until(run_id, predicate), SLOW_S)


async def delivered(h, run_id):
    return await until(h, run_id, lambda t: t.delivered_at is not None)


async def polled_to_the_end(h, vt: VirtualClock, run_id: int):
    """Advance the virtual clock each time the run's watcher waits to ask again, until the run ends."""
    while True:
        ended = asyncio.ensure_future(h.service.wait_until(run_id, lambda t: t.terminal))
        asking = asyncio.ensure_future(vt.wait_sleeper(lambda d: d == 5))
        done, pending = await asyncio.wait({ended, asking}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if ended in done:
            return ended.result()
        vt.advance(5)


def first_turns(model: FakeAgentModel, task: str) -> int:
    """How many agent runs began on `task` (first model turns whose last message is it): never two."""
    return sum(1 for body in model.requests
               if body["messages"][-1].get("role") == "user" and body["messages"][-1].get("content") == task)


@SHARED
async def test_a_run_streams_and_completes_with_its_long_answer_intact(shared_hermes, tmp_path):
    model, gateway = shared_hermes
    async with real(gateway, tmp_path) as h:
        await h.service.delegate("write it all out [long:29400]")
        done = await delivered(h, 1)
        assert done.state is RunState.COMPLETED and done.output == long_answer(29400)
        assert h.call.said[0].startswith("Run 1 (write it all out [long:29400]) finished: w0 w1")
        assert [t.id for t in h.sink.posted] == [1]
    assert first_turns(model, "write it all out [long:29400]") == 1


@SHARED
async def test_a_wrong_key_is_running_but_rejected_and_steering_is_not_offered(shared_hermes):
    _, gateway = shared_hermes
    wrong = HermesApiLane(RunsConfig(hermes_url=gateway.url, hermes_key="sk-wrong-but-long-enough-0000"))
    right = HermesApiLane(RunsConfig(hermes_url=gateway.url, hermes_key=REAL_KEY))
    try:
        refused, probe = await wrong.probe(), await right.probe()
    finally:
        await wrong.aclose()
        await right.aclose()
    assert refused.reason == "hermes-api is running but rejected my key" and REAL_KEY not in refused.detail
    assert probe.available and not probe.can_steer  # 0.19.0 lists no run_steer


@SHARED
@pytest.mark.parametrize("choice", ["once", "deny"])
async def test_an_approval_keeps_its_choices_when_polled_and_the_answer_reaches_the_agent(
        shared_hermes, tmp_path, choice):
    model, gateway = shared_hermes
    marker = tmp_path / "approved"
    task = f"tidy up [approve:touch {marker} && rm -rf {tmp_path}/nothing-here]"
    async with real(gateway, tmp_path) as h:
        await h.service.delegate(task)
        waiting = await until(h, 1, lambda t: t.state is RunState.WAITING_FOR_APPROVAL)
        assert waiting.approval.choices == DEFAULT_APPROVAL_CHOICES and waiting.approval.request_id is None
        assert "Run 1 asks for permission" in await asyncio.wait_for(h.call.wait_said("asks for permission"),
                                                                    SAFETY_S)
        # the real status names no question: polled, it is still the question the stream put
        polled = await h.service.lanes["hermes-api"].snapshot(waiting)
        assert polled.observation == ApprovalRequested(None, DEFAULT_APPROVAL_CHOICES, waiting.approval.description)
        answered = await h.service.resolve_approval(1, choice)
        assert answered.choice == choice
        done = await delivered(h, 1)
        assert done.state is RunState.COMPLETED and done.output.startswith("after approval:")
    assert marker.exists() is (choice == "once")
    assert first_turns(model, task) == 1


@SHARED
async def test_stop_cancels_a_running_run_and_a_stop_after_the_end_reports_the_result(shared_hermes, tmp_path):
    model, gateway = shared_hermes
    async with real(gateway, tmp_path) as h:
        await h.service.delegate("think hard [hold:stop-1]")
        await asyncio.wait_for(model.held("stop-1"), SLOW_S)
        await accepted(h, 1)
        stopped = await h.service.stop(1, "wrong repo")
        assert stopped.summary == "stopping run 1 (hermes-api says stopping)"
        model.release("stop-1")
        done = await delivered(h, 1)
        assert done.state is RunState.CANCELLED and done.error == "stopped: wrong repo"
        assert h.call.said == ["Run 1 (think hard [hold:stop-1]) was stopped."]

    lane = HermesApiLane(RunsConfig(hermes_url=gateway.url, hermes_key=REAL_KEY))
    ticket = RunTicket(id=2, lane="hermes-api", task="quick one", state=RunState.STARTING, created_at=0.0,
                       updated_at=0.0, idempotency_key="switchboard-quick")
    seen: list = []

    async def collect(obs):
        seen.append(obs)

    try:
        ticket = RunTicket(**{**vars(ticket), "external_id": await lane.start(ticket)})
        await asyncio.wait_for(lane.follow(ticket, collect), SLOW_S)
        # Hermes answers 404 to a stop once the run has ended: the answer is how it ended
        with pytest.raises(AlreadyEnded) as ended:
            await lane.stop(ticket)
    finally:
        await lane.aclose()
    assert seen[-1] == ended.value.observation == Finished(RunState.COMPLETED, output="done: quick one")


@SHARED
async def test_fifteen_delegations_all_finish_ten_at_once_and_five_queued(shared_hermes, tmp_path):
    model, gateway = shared_hermes
    tasks = [f"job {n} [hold:cap-{n}]" for n in range(1, 16)]
    async with real(gateway, tmp_path) as h:
        for task in tasks:
            await h.service.delegate(task)
        states = [await until(h, n, lambda t: t.external_id is not None or (t.progress or "").startswith(
            "queued at Hermes")) for n in range(1, 16)]
        assert sum(t.external_id is not None for t in states) == 10
        queued = [t for t in states if t.external_id is None]
        assert len(queued) == 5 and all("all 10 of its run slots are taken" in t.progress for t in queued)
        for n in range(1, 16):
            model.release(f"cap-{n}")
        finished = [await delivered(h, n) for n in range(1, 16)]
    assert [t.state for t in finished] == [RunState.COMPLETED] * 15
    assert [t.output for t in finished] == [f"done: {task}" for task in tasks]
    assert [first_turns(model, task) for task in tasks] == [1] * 15  # none started twice


@SHARED
async def test_a_429_at_the_servers_cap_is_queued_at_hermes_and_retried_with_backoff(shared_hermes):
    """The lane allows 11 at once, the server 10: the 11th is answered 429, shown queued, and retried."""
    model, gateway = shared_hermes
    vt = VirtualClock(1_750_000_000.0)
    lane = HermesApiLane(RunsConfig(hermes_url=gateway.url, hermes_key=REAL_KEY, hermes_max_runs=11), sleep=vt.sleep)
    tickets = [RunTicket(id=n, lane="hermes-api", task=f"busy {n} [hold:busy-{n}]", state=RunState.STARTING,
                         created_at=0.0, updated_at=0.0, idempotency_key=f"switchboard-busy-{n}") for n in range(11)]
    said: list = []

    async def collect(obs):
        said.append(obs)

    try:
        ids = [await lane.start(t) for t in tickets[:10]]
        eleventh = asyncio.create_task(lane.start(tickets[10], collect))
        await asyncio.wait_for(vt.wait_sleeper(lambda d: d == 1.0), SLOW_S)
        assert said == [Progress("queued at Hermes: it is running all the runs it takes; trying again shortly")]
        model.release("busy-0")
        first = RunTicket(**{**vars(tickets[0]), "external_id": ids[0]})
        await asyncio.wait_for(lane.follow(first, collect), SLOW_S)
        vt.advance(1.0)
        started = await asyncio.wait_for(eleventh, SLOW_S)
        assert started.startswith("run_") and started not in ids
    finally:
        for n in range(11):
            model.release(f"busy-{n}")
        await lane.aclose()
    assert max(first_turns(model, t.task) for t in tickets) <= 1  # the 429 was not a second start


@SHARED
async def test_a_switchboard_crash_mid_run_then_a_restart_posts_the_real_result_once(shared_hermes, tmp_path):
    """The dead instance's stream took the run's queue with it: the new one follows by status."""
    model, gateway = shared_hermes
    vt = VirtualClock(1_750_000_000.0)
    async with real(gateway, tmp_path, vt=vt, owner="old-host:1:1:dead", crash=True) as first:
        await first.service.delegate("audit it [hold:crash]")
        await asyncio.wait_for(model.held("crash"), SLOW_S)
        run = await accepted(first, 1)
        await asyncio.wait_for(first.vt.wait_sleeper(lambda d: d == QUIET_S), SLOW_S)  # on its stream
    async with real(gateway, tmp_path, vt=vt) as second:
        await asyncio.wait_for(vt.wait_sleeper(), SLOW_S)  # the new instance follows it now
        model.release("crash")  # it ends while the dead instance's stream still holds the run's queue
        await asyncio.wait_for(polled_to_the_end(second, vt, 1), SLOW_S)
        done = await delivered(second, 1)
        assert done.external_id == run.external_id
        assert done.state is RunState.COMPLETED and done.output == "done: audit it [hold:crash]"
        assert [t.id for t in second.sink.posted] == [1] and len(second.call.said) == 1
    assert first_turns(model, "audit it [hold:crash]") == 1


@SHARED
async def test_after_a_restart_a_run_is_followed_by_its_status_because_a_dead_subscriber_takes_its_end(
        shared_hermes, tmp_path):
    """An old instance's stream still holds the run's one event queue when it dies: Hermes's handler
    takes `run.completed`, fails to write it and removes the queue, and a second subscriber would idle
    on keepalives. The new instance must not subscribe again, but ask the status."""
    model, gateway = shared_hermes
    vt = VirtualClock(1_750_000_000.0)
    lane = HermesApiLane(RunsConfig(hermes_url=gateway.url, hermes_key=REAL_KEY), sleep=vt.sleep)
    ticket = RunTicket(id=1, lane="hermes-api", task="audit it [hold:dead]", state=RunState.STARTING,
                       created_at=0.0, updated_at=0.0, idempotency_key="switchboard-dead")
    seen: list = []

    async def collect(obs):
        seen.append(obs)

    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        ticket = RunTicket(**{**vars(ticket), "external_id": await lane.start(ticket)})
        writer.write(f"GET /v1/runs/{ticket.external_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     f"Authorization: Bearer {REAL_KEY}\r\n\r\n".encode())  # the old instance: never reads
        await writer.drain()
        assert (await asyncio.wait_for(reader.readline(), SLOW_S)).startswith(b"HTTP/1.1 200")
        await asyncio.wait_for(model.held("dead"), SLOW_S)
        assert await lane.reconcile(ticket) == [Running()]  # still running: the new instance adopts it
        follow = asyncio.create_task(lane.follow(ticket, collect))
        await asyncio.wait_for(vt.wait_sleeper(), SLOW_S)
        writer.close()  # now it dies: Hermes notices only when it writes the run's next event to it
        model.release("dead")
        while not follow.done():
            waiting = asyncio.ensure_future(vt.wait_sleeper(lambda d: d == 5))
            await asyncio.wait_for(asyncio.wait({follow, waiting}, return_when=asyncio.FIRST_COMPLETED), SLOW_S)
            waiting.cancel()
            vt.advance(5)
    finally:
        writer.close()
        await lane.aclose()
    assert seen[-1] == Finished(RunState.COMPLETED, output="done: audit it [hold:dead]")


@RESTARTS
async def test_a_gateway_shutdown_is_said_as_hermes_stopping_the_run(own_hermes, tmp_path):
    model, gateway = own_hermes
    async with real(gateway, tmp_path) as h:
        await h.service.delegate("long job [hold:term]")
        await asyncio.wait_for(model.held("term"), SLOW_S)
        await accepted(h, 1)
        gateway.send(signal.SIGTERM)
        done = await until(h, 1, lambda t: t.terminal)
        model.release("term")
        gateway.wait_exit()
        done = await delivered(h, 1)
    assert done.state is RunState.CANCELLED and done.error == HERMES_STOPPED
    assert h.call.said == [f"Run 1 (long job [hold:term]): {HERMES_STOPPED}."]


@RESTARTS
async def test_a_gateway_killed_and_restarted_lost_the_run_and_it_is_said_once(own_hermes, tmp_path):
    model, gateway = own_hermes
    vt = VirtualClock(1_750_000_000.0)
    async with real(gateway, tmp_path, vt=vt) as h:
        await h.service.delegate("long job [hold:kill]")
        await asyncio.wait_for(model.held("kill"), SLOW_S)
        await accepted(h, 1)
        gateway.kill(signal.SIGKILL)
        await asyncio.wait_for(vt.wait_sleeper(lambda d: d == 5), SLOW_S)  # the stream dropped: polling
        gateway.start()  # the same port, nothing in memory
        vt.advance(5)
        done = await delivered(h, 1)
        model.release("kill")
    assert done.state is RunState.LOST and done.error == HERMES_LOST
    assert len(h.call.said) == 1 and "Hermes restarted and lost this run" in h.call.said[0]
    assert [t.id for t in h.sink.posted] == [1]
