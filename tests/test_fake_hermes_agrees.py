"""One script, run against our fake api_server and against the real hermes-agent 0.19.0: every shape they
share must agree (what the fake adds beyond it is opt-in: tests/support/fake_hermes.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.support.fake_agent_model import FakeAgentModel
from tests.support.fake_hermes import FakeHermes
from tests.support.real_hermes import REAL_KEY, RealHermes

SAFETY_S = 60.0
RUN_FEATURES = ("run_submission", "run_status", "run_events_sse", "run_stop", "run_approval_response", "run_steer",
                "runs_idempotency")


async def events(http: httpx.AsyncClient, run_id: str) -> list[dict]:
    """Every event of the run's stream, to its end."""
    seen = []
    async with http.stream("GET", f"/v1/runs/{run_id}/events") as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
    return seen


async def script(url: str, key: str, finish) -> dict:
    """What the server answered, reduced to shapes (ids and times left out)."""
    shapes: dict = {}
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=SAFETY_S) as http:
        caps = (await http.get("/v1/capabilities")).json()
        shapes["capabilities"] = (caps["object"], {f: caps["features"].get(f, False) for f in RUN_FEATURES})
        wrong = await http.get("/v1/capabilities", headers={"Authorization": "Bearer sk-not-the-key-0000000000"})
        shapes["wrong key"] = (wrong.status_code, wrong.json()["error"]["code"])
        missing = await http.get("/v1/runs/run_0123")
        shapes["unknown run"] = (missing.status_code, missing.json()["error"]["code"])
        bad = await http.post("/v1/runs", json={"instructions": "no input"})
        shapes["no input"] = bad.status_code
        first = await http.post("/v1/runs", json={"input": "say hi"}, headers={"Idempotency-Key": "k-1"})
        again = await http.post("/v1/runs", json={"input": "say hi"}, headers={"Idempotency-Key": "k-1"})
        shapes["submit"] = (first.status_code, sorted(first.json()), first.json()["status"])
        shapes["same key twice"] = first.json()["run_id"] != again.json()["run_id"]
        for response in (first, again):
            run_id = response.json()["run_id"]
            await finish(run_id)
            streamed = await events(http, run_id)
            last = streamed[-1]
            shapes["last event"] = (last["event"], sorted(k for k in last if k != "usage"))
            status = (await http.get(f"/v1/runs/{run_id}")).json()
            shapes["status"] = (status["object"], status["status"], status["output"], status["last_event"],
                                "approval" in status)
            stop = await http.post(f"/v1/runs/{run_id}/stop")
            shapes["stop after the end"] = (stop.status_code, stop.json()["error"]["code"])
            late = await http.post(f"/v1/runs/{run_id}/approval", json={"choice": "once"})
            shapes["approval after the end"] = (late.status_code, late.json()["error"]["code"])
            again_stream = await http.get(f"/v1/runs/{run_id}/events")
            shapes["second subscriber"] = again_stream.status_code
    return shapes


@pytest.mark.xdist_group("hermes_real")
async def test_the_fake_and_the_real_api_server_answer_the_same_script_alike(tmp_path):
    async with FakeHermes(key=REAL_KEY) as fake:
        for _ in range(5):
            fake.expect_violation()  # the wrong key, the unknown run, the missing input, two late answers

        async def complete(run_id: str) -> None:
            fake.emit(run_id, "message.delta", delta="done: say hi")
            fake.complete(run_id, "done: say hi")

        faked = await script(fake.url, REAL_KEY, complete)
        fake.assert_clean()

    with FakeAgentModel() as model:
        gateway = RealHermes(model, tmp_path / "hermes").start()
        try:
            async def nothing(run_id: str) -> None:  # the real agent answers at once
                await asyncio.sleep(0)

            really = await script(gateway.url, REAL_KEY, nothing)
        finally:
            gateway.stop()
    assert faked == really
