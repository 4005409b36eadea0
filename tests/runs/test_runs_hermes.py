"""The hermes-api lane against a strict fake api_server on loopback — and the fake's own strictness."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from runs.config import RunsConfig
from runs.core import (
    ApprovalAnswered,
    ApprovalRequested,
    Finished,
    Progress,
    Running,
    RunState,
    RunTicket,
)
from runs.hermes_wire import HERMES_LOST, HERMES_STOPPED
from runs.lanes import HermesApiLane, LaneError, SubmitUnknown
from runs.lanes.hermes_api import QUIET_S, UNCONFIRMED
from tests.support.clock import VirtualClock
from tests.support.fake_hermes import DEFAULT_FEATURES, STEER_FEATURES, FakeHermes
from tests.support.runs import KEY, SAFETY_S, free_port


def ticket(**kw) -> RunTicket:
    base = dict(id=1, lane="hermes-api", task="audit the auth module", state=RunState.STARTING,
                created_at=0.0, updated_at=0.0, idempotency_key="switchboard-0123456789abcdef")
    base.update(kw)
    return RunTicket(**base)


def lane_for(fake: FakeHermes, key: str | None = KEY, **kw) -> HermesApiLane:
    return HermesApiLane(RunsConfig(hermes_url=fake.url, hermes_key=key, poll_interval_s=5), **kw)


class Collector:
    def __init__(self) -> None:
        self.seen: list = []
        self._changed = asyncio.Condition()

    async def __call__(self, obs) -> None:
        self.seen.append(obs)
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, kind) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: any(isinstance(o, kind) for o in self.seen))


# -- the fake is strict ----------------------------------------------------------------------------

async def test_fake_rejects_what_the_real_api_server_rejects():
    async with FakeHermes(key=KEY, features=STEER_FEATURES) as fake, httpx.AsyncClient(base_url=fake.url) as http:
        auth = {"Authorization": f"Bearer {KEY}"}
        assert (await http.get("/v1/capabilities")).status_code == 401
        assert (await http.get("/v1/capabilities", headers={"Authorization": "Bearer nope"})).status_code == 401
        assert (await http.post("/v1/runs", json={"instructions": "x"}, headers=auth)).status_code == 400
        assert (await http.post("/v1/runs", content=b"{not json", headers=auth)).status_code == 400
        # like hermes-agent 0.19.0, it ignores Idempotency-Key: the same key twice is two runs
        first = await http.post("/v1/runs", json={"input": "t"}, headers={**auth, "Idempotency-Key": "k1"})
        again = await http.post("/v1/runs", json={"input": "t"}, headers={**auth, "Idempotency-Key": "k1"})
        assert first.status_code == again.status_code == 202 and first.json()["run_id"] != again.json()["run_id"]
        run_id = first.json()["run_id"]
        assert (await http.post(f"/v1/runs/{run_id}/steer", json={"input": " "}, headers=auth)).status_code == 400
        assert (await http.post(f"/v1/runs/{run_id}/approval", json={"choice": "once"},
                                headers=auth)).status_code == 409
        fake.request_approval(run_id)
        assert (await http.post(f"/v1/runs/{run_id}/approval", json={"choice": "maybe"},
                                headers=auth)).status_code == 400
        assert (await http.post(f"/v1/runs/{run_id}/steer", json={"input": "x"},
                                headers=auth)).status_code == 409  # waiting, not running
        assert (await http.get("/v1/runs/run_missing", headers=auth)).status_code == 404
        fake.complete(run_id)
        assert (await http.post(f"/v1/runs/{run_id}/stop", headers=auth)).status_code == 404  # ended
        assert fake.submissions == 2
        assert len(fake.violations) == 9  # a stop racing the run's end is no client bug
        with pytest.raises(AssertionError, match="would reject"):
            fake.assert_clean()


# -- probing ---------------------------------------------------------------------------------------

async def test_a_refused_connection_is_not_running_with_how_to_enable_it():
    lane = HermesApiLane(RunsConfig(hermes_url=f"http://127.0.0.1:{free_port()}", hermes_key=KEY))
    probe = await lane.probe()
    await lane.aclose()
    assert not probe.available and probe.reason == "hermes-api is not running"
    assert "API_SERVER_ENABLED=true" in probe.detail and "API_SERVER_KEY" in probe.detail
    assert KEY not in probe.detail


async def test_a_wrong_key_is_running_but_rejected_not_unreachable():
    async with FakeHermes(key=KEY) as fake:
        fake.expect_violation()
        lane = lane_for(fake, key="wrong-key")
        probe = await lane.probe()
        await lane.aclose()
        fake.assert_clean()
    assert not probe.available and probe.reason == "hermes-api is running but rejected my key"
    assert "wrong-key" not in probe.detail and KEY not in probe.detail


async def test_a_blank_key_sends_no_authorization_header():
    async with FakeHermes(key=None) as fake:
        lane = lane_for(fake, key="")
        assert (await lane.probe()).available
        run_id = await lane.start(ticket())
        fake.complete(run_id, "ok")
        await lane.aclose()
        fake.assert_clean()
    assert fake.requests and all(r["authorization"] is None for r in fake.requests)


async def test_a_missing_key_against_a_keyed_server_says_which_variable_to_set():
    async with FakeHermes(key=KEY) as fake:
        fake.expect_violation()
        lane = lane_for(fake, key=None)
        probe = await lane.probe()
        await lane.aclose()
    assert "rejected my key" in probe.reason and "SWITCHBOARD_HERMES_API_KEY" in probe.detail


async def test_features_are_detected_from_capabilities():
    async with FakeHermes(key=KEY, features=DEFAULT_FEATURES) as fake:  # 0.19.0: no run_steer
        lane = lane_for(fake)
        probe = await lane.probe()
        run_id = await lane.start(ticket())
        with pytest.raises(LaneError, match="does not offer steering"):
            await lane.steer(ticket(external_id=run_id), "note")
        await lane.aclose()
    assert probe.available and not probe.can_steer
    assert not any(r["path"].endswith("/steer") for r in fake.requests)

    async with FakeHermes(key=KEY, features={"run_status": True}) as fake:
        lane = lane_for(fake)
        probe = await lane.probe()
        await lane.aclose()
    assert not probe.available and "run_submission" in probe.detail


# -- submission ------------------------------------------------------------------------------------

async def test_a_submission_is_sent_once_with_the_task_as_input():
    async with FakeHermes(key=KEY) as fake:
        lane = lane_for(fake)
        run_id = await lane.start(ticket())
        await lane.aclose()
        fake.assert_clean()
    assert run_id == fake.only_run().run_id and fake.submissions == 1
    assert [r["body"] for r in fake.requests if r["method"] == "POST"] == [{"input": "audit the auth module"}]


class LoseFirstResponse(httpx.AsyncBaseTransport):
    """Delivers the first POST to the server, then loses its response (as a dropped connection would)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.lost = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST" and not self.lost:
            self.lost += 1
            await response.aread()
            raise httpx.ReadError("connection reset", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class RefuseFirstConnection(LoseFirstResponse):
    """The first POST never leaves: its connection is refused."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and not self.lost:
            self.lost += 1
            raise httpx.ConnectError("connection refused", request=request)
        return await self.inner.handle_async_request(request)


async def test_a_submission_whose_answer_was_lost_is_never_sent_again_and_says_so():
    """Hermes ignores Idempotency-Key: a resend could start the run twice, so its fate is unknown."""
    transport = LoseFirstResponse()
    async with FakeHermes(key=KEY) as fake, httpx.AsyncClient(transport=transport) as client:
        lane = lane_for(fake, client=client)
        with pytest.raises(SubmitUnknown, match="may have started it.*not sent again"):
            await lane.start(ticket())
        fake.assert_clean()
    assert transport.lost == 1 and fake.submissions == 1


async def test_a_refused_connection_is_retried_because_nothing_was_sent():
    vt = VirtualClock(1_750_000_000.0)
    transport = RefuseFirstConnection()
    async with FakeHermes(key=KEY) as fake, httpx.AsyncClient(transport=transport) as client:
        lane = lane_for(fake, client=client, sleep=vt.sleep)
        start = asyncio.create_task(lane.start(ticket()))
        await vt.wait_sleeper()
        vt.advance(1)
        run_id = await start
        fake.assert_clean()
    assert transport.lost == 1 and fake.submissions == 1 and run_id == fake.only_run().run_id


async def test_a_refused_submission_is_a_lane_error_with_the_servers_reason():
    async with FakeHermes(key=KEY) as fake:
        lane = lane_for(fake)
        fake.expect_violation()
        with pytest.raises(LaneError, match="Missing 'input'"):
            await lane.start(ticket(task=""))
        await lane.aclose()


# -- following -------------------------------------------------------------------------------------

@pytest.mark.parametrize("sse_event_field", [False, True])
async def test_events_become_progress_approval_and_completion(sse_event_field):
    async with FakeHermes(key=KEY, sse_event_field=sse_event_field) as fake:
        lane = lane_for(fake)
        run_id = await lane.start(ticket())
        seen = Collector()
        follow = asyncio.create_task(lane.follow(ticket(external_id=run_id), seen))
        await asyncio.wait_for(fake.runs[run_id].stream_open.wait(), SAFETY_S)
        fake.keepalive(run_id)
        fake.progress(run_id, "web_search", "auth module")
        fake.request_approval(run_id, description="run `git push`")
        await asyncio.wait_for(seen.wait_for(ApprovalRequested), SAFETY_S)
        await lane.answer(ticket(external_id=run_id), None, "once")
        fake.complete(run_id, "three gaps found")
        await asyncio.wait_for(follow, SAFETY_S)
        await lane.aclose()
        fake.assert_clean()
    assert seen.seen == [
        Progress("using web_search: auth module"),
        ApprovalRequested(None, ("once", "session", "always", "deny"), "run `git push`"),
        ApprovalAnswered("once"),
        Finished(RunState.COMPLETED, output="three gaps found"),
    ]
    assert fake.runs[run_id].answers == [{"choice": "once"}]


async def test_a_dropped_stream_is_reconciled_with_the_run_status():
    vt = VirtualClock(1_750_000_000.0)
    async with FakeHermes(key=KEY) as fake:
        lane = lane_for(fake, sleep=vt.sleep)
        run_id = await lane.start(ticket())
        seen = Collector()
        follow = asyncio.create_task(lane.follow(ticket(external_id=run_id), seen))
        await asyncio.wait_for(fake.runs[run_id].stream_open.wait(), SAFETY_S)
        fake.progress(run_id)
        fake.drop_stream(run_id)
        await asyncio.wait_for(seen.wait_for(Running), SAFETY_S)  # asked GET /v1/runs/{id}: still going
        await vt.wait_sleeper(lambda d: d == 5)
        fake.set_status(run_id, "completed", output="finished while nobody listened")
        vt.advance(5)
        await asyncio.wait_for(follow, SAFETY_S)
        await lane.aclose()
        fake.assert_clean()
    assert seen.seen[-1] == Finished(RunState.COMPLETED, output="finished while nobody listened")
    gets = [r["path"] for r in fake.requests if r["method"] == "GET"]
    assert gets.count(f"/v1/runs/{run_id}") == 2 and gets.count(f"/v1/runs/{run_id}/events") == 1


async def test_a_stream_quiet_past_its_bound_asks_the_status_and_ends_with_the_result():
    """Hermes's one queue per run: another subscriber may have taken the end. Only keepalives for
    QUIET_S → the status is asked, and it carries the result."""
    vt = VirtualClock(1_750_000_000.0)
    async with FakeHermes(key=KEY) as fake:
        lane = lane_for(fake, sleep=vt.sleep)
        run_id = await lane.start(ticket())
        seen = Collector()
        follow = asyncio.create_task(lane.follow(ticket(external_id=run_id), seen))
        await asyncio.wait_for(fake.runs[run_id].stream_open.wait(), SAFETY_S)
        await vt.wait_sleeper(lambda d: d == QUIET_S)
        fake.keepalive(run_id)  # a keepalive is not news: the watch still asks
        fake.set_status(run_id, "completed", output="the end went elsewhere")
        vt.advance(QUIET_S)
        await asyncio.wait_for(follow, SAFETY_S)
        await lane.aclose()
        fake.assert_clean()
    assert seen.seen == [Finished(RunState.COMPLETED, output="the end went elsewhere")]


async def test_more_runs_than_stream_connections_all_start_and_finish_and_requests_still_go_through():
    """Four stream connections and four request connections: six runs at once all start and finish
    (four over their event stream, two by their status), and a seventh request is not starved."""
    vt = VirtualClock(1_750_000_000.0)
    async with FakeHermes(key=KEY, features=STEER_FEATURES) as fake:  # a Hermes that steers: notes too
        lane = lane_for(fake, sleep=vt.sleep, stream_limit=4, request_limit=4)
        runs, seen, follows = [], [], []
        try:
            for n in range(1, 7):
                draft = ticket(id=n, task=f"task {n}", idempotency_key=f"switchboard-{n:032x}")
                runs.append(ticket(id=n, task=f"task {n}", external_id=await asyncio.wait_for(lane.start(draft),
                                                                                               SAFETY_S)))
                seen.append(Collector())
                follows.append(asyncio.create_task(lane.follow(runs[-1], seen[-1])))
                if n <= 4:  # a free stream slot: the run is followed over its event stream
                    await asyncio.wait_for(fake.runs[runs[-1].external_id].stream_open.wait(), SAFETY_S)
                else:  # every slot taken: asked for its status at once, then every poll interval
                    await asyncio.wait_for(seen[-1].wait_for(Running), SAFETY_S)
                    await asyncio.wait_for(vt.wait_sleeper(lambda d: d == 5), SAFETY_S)
                    if n == 5:
                        vt.advance(1)  # run 5's poll is now 4 s away: only run 6's can be 5 s away next
            assert lane.streams_open == 4
            assert [fake.runs[r.external_id].stream_used for r in runs] == [True] * 4 + [False] * 2

            # four streams hold four connections; requests have their own, and all of these go through
            assert (await asyncio.wait_for(lane.probe(), SAFETY_S)).available
            await asyncio.wait_for(lane.steer(runs[0], "[sb-1] also check the logs"), SAFETY_S)
            seventh = ticket(id=7, task="task 7", idempotency_key=f"switchboard-{7:032x}")
            seventh = ticket(id=7, task="task 7", external_id=await asyncio.wait_for(lane.start(seventh), SAFETY_S))
            assert fake.submissions == 7 and fake.runs[runs[0].external_id].steers == ["[sb-1] also check the logs"]

            for run in runs[:4]:
                fake.complete(run.external_id, f"done {run.id}")
            for run in runs[4:]:
                fake.set_status(run.external_id, "completed", output=f"done {run.id}")
            await asyncio.wait_for(asyncio.gather(*follows[:4]), SAFETY_S)
            vt.advance(5)  # both polls are due now
            await asyncio.wait_for(asyncio.gather(*follows[4:]), SAFETY_S)
            for run, collector in zip(runs, seen, strict=True):
                assert collector.seen[-1] == Finished(RunState.COMPLETED, output=f"done {run.id}")
            assert lane.streams_open == 0

            # the slots are free again: the seventh run is followed over its stream
            last = Collector()
            follows.append(asyncio.create_task(lane.follow(seventh, last)))
            await asyncio.wait_for(fake.runs[seventh.external_id].stream_open.wait(), SAFETY_S)
            fake.complete(seventh.external_id, "done 7")
            await asyncio.wait_for(follows[-1], SAFETY_S)
            assert last.seen == [Finished(RunState.COMPLETED, output="done 7")]
            fake.assert_clean()
        finally:
            for follow in follows:
                follow.cancel()
            await asyncio.gather(*follows, return_exceptions=True)
            await lane.aclose()


def test_pool_limits_below_one_are_refused():
    config = RunsConfig(hermes_key=KEY)
    for limits in ({"stream_limit": 0}, {"request_limit": 0}):
        with pytest.raises(ValueError, match="at least 1"):
            HermesApiLane(config, **limits)


async def test_steer_and_stop_use_the_run_endpoints():
    async with FakeHermes(key=KEY, features=STEER_FEATURES) as fake:
        lane = lane_for(fake)
        run_id = await lane.start(ticket())
        t = ticket(external_id=run_id)
        await lane.steer(t, "[sb-1] focus on token refresh")
        snapshot = await lane.snapshot(t)
        assert snapshot.pending_notes == "[sb-1] focus on token refresh" and snapshot.observation == Running()
        fake.consume_steer(run_id)
        assert (await lane.snapshot(t)).pending_notes == ""
        fake.settle_stop = False
        assert await lane.stop(t) == "stopping"
        assert (await lane.snapshot(t)).observation == Running()  # stopping is not over yet
        fake.cancel(run_id)
        snapshot = await lane.snapshot(t)
        # the lane cannot tell who stopped it; the ticket's stop request says so (core._finish)
        assert snapshot.terminal and snapshot.observation == Finished(RunState.CANCELLED, error=HERMES_STOPPED,
                                                                      interrupted=True)
        await lane.aclose()
        fake.assert_clean()


async def test_reconcile_after_a_restart_asks_the_status_and_never_resubmits():
    async with FakeHermes(key=KEY) as fake:
        lane = lane_for(fake)
        run_id = await lane.start(ticket())
        fake.set_status(run_id, "failed", error="out of credits")
        assert await lane.reconcile(ticket(external_id=run_id)) == [Finished(RunState.FAILED, error="out of credits")]
        # recorded but never confirmed: Hermes may have it, so it is not sent again (that could double it)
        unconfirmed = await lane.reconcile(ticket())
        assert unconfirmed == [Finished(RunState.LOST, error=UNCONFIRMED)] and fake.submissions == 1
        fake.expect_violation()
        lost = await lane.reconcile(ticket(external_id="run_unknown"))
        assert lost == [Finished(RunState.LOST, error=HERMES_LOST)]
        await lane.aclose()
        fake.assert_clean()

    gone = HermesApiLane(RunsConfig(hermes_url=f"http://127.0.0.1:{free_port()}", hermes_key=KEY))
    unreachable = await gone.reconcile(ticket(external_id="run_x"))
    await gone.aclose()
    assert unreachable[0].state is RunState.LOST and "could not ask hermes-api" in unreachable[0].error
