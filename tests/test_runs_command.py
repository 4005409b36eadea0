"""The command lane with real subprocesses (the fake agent): output, failures, the cap, stop, no shell."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from bot.runs.config import RunsConfig
from bot.runs.core import Finished, RunState, RunTicket
from bot.runs.lanes import CommandLane, LaneError
from tests.test_runs_harness import SAFETY_S, ProcessWatch, VirtualTime, agent_command, read_fifo


def ticket(task: str = "audit the auth module", **kw) -> RunTicket:
    return RunTicket(id=kw.pop("id", 1), lane="command", task=task, state=RunState.STARTING, created_at=0.0,
                     updated_at=0.0, **kw)


def lane(command, *, vt: VirtualTime | None = None, **config) -> CommandLane:
    cfg = RunsConfig(command=tuple(command), **config)
    return CommandLane(cfg, sleep=vt.sleep if vt else asyncio.sleep)


async def run_to_end(lane: CommandLane, t: RunTicket) -> Finished:
    seen: list = []

    async def emit(obs) -> None:
        seen.append(obs)

    external = await lane.start(t)
    await asyncio.wait_for(lane.follow(t, emit), SAFETY_S)
    assert external.split(":")[0].isdigit()
    assert len(seen) == 1 and isinstance(seen[0], Finished)
    return seen[0]


async def test_an_answer_is_the_output_and_the_task_is_one_argument_without_a_shell():
    task = 'say "hi"; touch /tmp/pwned-by-switchboard $(id) `id` && exit 3'
    finished = await run_to_end(lane(agent_command("answer", "--argv")), ticket(task))
    assert finished.state is RunState.COMPLETED and not finished.output_cut
    argv_line, answer_line = finished.output.strip().splitlines()
    assert json.loads(argv_line)[-1] == task
    assert answer_line == f"answer: {task}"
    assert not Path("/tmp/pwned-by-switchboard").exists()


def fake_hermes_program(tmp_path: Path) -> str:
    """An executable named `hermes` that prints the arguments it was given as JSON."""
    program = tmp_path / "bin" / "hermes"
    program.parent.mkdir()
    program.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n")
    program.chmod(0o755)
    return str(program)


async def test_hermes_gets_the_set_or_the_detected_profile_and_no_flag_when_opted_out(tmp_path):
    hermes = fake_hermes_program(tmp_path)
    home = tmp_path / "hermes-home"
    (home / "profiles" / "work").mkdir(parents=True)
    (home / "profiles" / "work" / "config.yaml").write_text("model:\n  default: gpt-5\n")
    template = (hermes, "-z", "{task}")

    async def argv_for(**config) -> list[str]:
        finished = await run_to_end(lane(template, hermes_home=home, **config), ticket("t"))
        return json.loads(finished.output)

    assert await argv_for(profile="other") == ["--profile", "other", "-z", "t"]
    assert await argv_for(profile=None) == ["--profile", "work", "-z", "t"]
    assert await argv_for(profile="") == ["-z", "t"]


async def test_a_failing_agent_is_failed_with_its_exit_status_and_stderr():
    finished = await run_to_end(lane(agent_command("fail")), ticket())
    assert finished.state is RunState.FAILED and not finished.interrupted
    assert "exited with status 1" in finished.error and "the model refused the task" in finished.error
    assert finished.output.strip() == "partial work before the failure"


async def test_flooding_output_is_capped_keeping_head_and_tail():
    finished = await run_to_end(lane(agent_command("flood", "--bytes", "2000000"), output_cap_bytes=4096),
                                ticket())
    assert finished.state is RunState.COMPLETED and finished.output_cut
    assert finished.output.startswith("line 00000000") and finished.output.rstrip().endswith("THE END")
    assert "bytes cut" in finished.output
    assert len(finished.output.encode()) < 4096 + 200


async def test_the_agent_does_not_see_switchboard_secrets():
    agent = CommandLane(RunsConfig(command=agent_command("env")),
                        env={**os.environ, "SWITCHBOARD_DISCORD_TOKEN": "secret-token", "KEEP_ME": "1"})
    finished = await run_to_end(agent, ticket())
    env = json.loads(finished.output)
    assert env.get("KEEP_ME") == "1" and not any(k.startswith("SWITCHBOARD_") for k in env)


async def test_stop_terminates_the_whole_process_group(tmp_path):
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    vt = VirtualTime()
    agent = lane(agent_command("hang", "--ready", str(fifo)), vt=vt)
    t = ticket()
    await agent.start(t)
    leader, child = (int(p) for p in (await read_fifo(fifo)).split())
    watches = [ProcessWatch(leader), ProcessWatch(child)]
    seen: list = []

    async def emit(obs) -> None:
        seen.append(obs)

    follow = asyncio.create_task(agent.follow(t, emit))
    assert await agent.stop(t) == "stopping"
    await asyncio.wait_for(follow, SAFETY_S)
    for watch in watches:
        await watch.exited()
    assert seen[0].state is RunState.FAILED and seen[0].interrupted and "SIGTERM" in seen[0].error
    assert seen[0].output.strip() == "working"
    await agent.aclose()


async def test_an_agent_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    vt = VirtualTime()
    agent = lane(agent_command("hang", "--ignore-term", "--ready", str(fifo)), vt=vt, stop_grace_s=5)
    t = ticket()
    await agent.start(t)
    leader, child = (int(p) for p in (await read_fifo(fifo)).split())
    watches = [ProcessWatch(leader), ProcessWatch(child)]
    seen: list = []

    async def emit(obs) -> None:
        seen.append(obs)

    follow = asyncio.create_task(agent.follow(t, emit))
    await agent.stop(t)
    await vt.wait_sleeper(lambda d: d == 5)
    assert not follow.done()  # SIGTERM was ignored; nothing ends before the grace period does
    vt.advance(5)
    await asyncio.wait_for(follow, SAFETY_S)
    for watch in watches:
        await watch.exited()
    assert "SIGKILL" in seen[0].error
    await agent.wait_stopped()


async def test_a_missing_executable_makes_the_lane_unavailable_naming_the_setting():
    probe = await lane(("no-such-agent-binary-xyz", "-z", "{task}")).probe()
    assert not probe.available
    assert "`no-such-agent-binary-xyz`" in probe.detail and "SWITCHBOARD_AGENT_COMMAND" in probe.detail
    template = await lane((sys.executable, "-c", "print(1)")).probe()
    assert not template.available and "{task}" in template.detail
    assert (await lane(agent_command("answer")).probe()).available


async def test_a_start_failure_is_a_lane_error_and_steering_is_refused_with_the_stop_offer(tmp_path):
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\necho hi\n")
    agent = lane((str(script), "{task}"))
    with pytest.raises(LaneError, match="could not start"):
        await agent.start(ticket())
    with pytest.raises(LaneError, match="stop it instead"):
        await agent.steer(ticket(id=4), "note")
    lost = await agent.reconcile(ticket(external_id="999999:1"))
    assert lost[0].state is RunState.LOST and "cannot be re-attached" in lost[0].error
