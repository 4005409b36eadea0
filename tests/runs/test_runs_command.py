"""The command lane with real subprocesses (the fake agent): output, failures, the cap, stop, no shell."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from runs.agent_command import (
    AGENT_ENV_NAMES,
    AGENT_ENV_PREFIXES,
    BOT_SECRET_VARIABLES,
    AgentEnvError,
    child_environment,
    parse_agent_env,
)
from runs.config import RunsConfig
from runs.core import Finished, RunState, RunTicket
from runs.lanes import CommandLane, LaneError
from tests.support.clock import VirtualClock
from tests.support.runs import SAFETY_S, ProcessWatch, agent_command, read_fifo


def ticket(task: str = "audit the auth module", **kw) -> RunTicket:
    return RunTicket(id=kw.pop("id", 1), lane="command", task=task, state=RunState.STARTING, created_at=0.0,
                     updated_at=0.0, **kw)


def lane(command, *, vt: VirtualClock | None = None, **config) -> CommandLane:
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


# Every key and token Switchboard itself may hold, as the operator's environment would carry them.
BOT_SECRETS = {
    "DISCORD_BOT_TOKEN": "discord-bot-token-NEVER-FOR-THE-AGENT-0001",
    "SWITCHBOARD_DISCORD_TOKEN": "discord-alt-token-NEVER-FOR-THE-AGENT-0002",
    "TRANSCRIPT_LISTENER_API_KEY": "sn-listener-key-NEVER-FOR-THE-AGENT-0003",
    "OPENAI_API_KEY": "sk-openai-key-NEVER-FOR-THE-AGENT-0004",
    "SWITCHBOARD_OPENAI_API_KEY": "sk-openai-scoped-NEVER-FOR-THE-AGENT-0005",
    "XAI_API_KEY": "xai-key-NEVER-FOR-THE-AGENT-0006",
    "API_SERVER_KEY": "hermes-api-key-NEVER-FOR-THE-AGENT-0007",
    "SWITCHBOARD_HERMES_API_KEY": "hermes-scoped-key-NEVER-FOR-THE-AGENT-0008",
    "SWITCHBOARD_TEXT_API_KEY": "sk-text-key-NEVER-FOR-THE-AGENT-0009",
    "SWITCHBOARD_CALLBACK_TOKEN": "sbt_someone-elses_token-NEVER-FOR-THE-AGENT",
}


def operator_environment(tmp_path: Path) -> dict[str, str]:
    """What `switchboard run` may hold: the basics, Hermes's own variables, the bot's secrets, and
    unrelated variables of the operator's shell."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "USER": "op", "LOGNAME": "op",
            "SHELL": "/bin/sh", "TERM": "dumb", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
            "TMPDIR": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "HERMES_HOME": str(tmp_path / "hermes"), "SWITCHBOARD_HOME": str(tmp_path / "sb"),
            "SWITCHBOARD_AGENT_LANES": "command", "AWS_SECRET_ACCESS_KEY": "aws-NEVER-FOR-THE-AGENT",
            "GITHUB_TOKEN": "ghp-NEVER-FOR-THE-AGENT", "SOME_TOOL_SETTING": "1", **BOT_SECRETS}


ALLOWED = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LC_ALL", "TZ", "TMPDIR", "XDG_CONFIG_HOME",
           "HERMES_HOME", "SWITCHBOARD_HOME"}


async def test_the_agent_process_gets_the_allow_list_and_never_a_key_or_token_switchboard_holds(tmp_path):
    agent = CommandLane(RunsConfig(command=agent_command("env")), env=operator_environment(tmp_path))
    finished = await run_to_end(agent, ticket())
    seen = json.loads(finished.output)  # what the real process found in its environment
    assert set(seen) == ALLOWED
    assert seen["HERMES_HOME"] == str(tmp_path / "hermes") and seen["PATH"] == os.environ.get("PATH", "/usr/bin:/bin")
    for value in [*BOT_SECRETS.values(), "aws-NEVER-FOR-THE-AGENT", "ghp-NEVER-FOR-THE-AGENT"]:
        assert value not in finished.output


async def test_an_operator_passes_more_by_name_but_never_a_secret_by_name_or_by_value(tmp_path):
    env = operator_environment(tmp_path)
    env["HERMES_BORROWED"] = f"--key={BOT_SECRETS['OPENAI_API_KEY']}"  # allow-listed name, a bot secret inside
    key = BOT_SECRETS["OPENAI_API_KEY"].encode()
    env["HERMES_ENCODED"] = base64.b64encode(b"k=" + key).decode()  # ... or an encoded copy of one
    env["HERMES_HEX"] = key.hex()
    env["HERMES_PERCENT"] = quote(f"x {BOT_SECRETS['OPENAI_API_KEY']}/", safe="")
    config = RunsConfig(command=agent_command("env"), agent_env=("SOME_TOOL_SETTING", "GITHUB_TOKEN"))
    agent = CommandLane(config, env=env, withhold=[BOT_SECRETS["OPENAI_API_KEY"], "", None])
    finished = await run_to_end(agent, ticket())
    seen = json.loads(finished.output)
    assert set(seen) == ALLOWED | {"SOME_TOOL_SETTING", "GITHUB_TOKEN"}  # the operator asked for the agent's own
    assert BOT_SECRETS["OPENAI_API_KEY"] not in finished.output


@pytest.mark.parametrize("names,says", [
    ("OPENAI_API_KEY", "one of Switchboard's secrets"), ("DISCORD_BOT_TOKEN", "one of Switchboard's secrets"),
    ("PATH,API_SERVER_KEY", "one of Switchboard's secrets"),
    ("SWITCHBOARD_CALLBACK_TOKEN", "one of Switchboard's secrets"),
    ("SWITCHBOARD_MODEL", "Switchboard's own setting"), ("BAD-NAME", "not a variable name"),
    ("A B", "not a variable name"), ("1ABC", "not a variable name"),
    # in any letter case: the same names to the agent's tools and to a reviewer's eye
    ("discord_bot_token", "one of Switchboard's secrets"), ("Openai_Api_Key", "one of Switchboard's secrets"),
    ("switchboard_model", "Switchboard's own setting"),
    # loader and start-up hooks: a value that makes a program run code
    *((name, "load or run code") for name in ("LD_PRELOAD", "LD_LIBRARY_PATH", "ld_preload", "BASH_ENV", "ENV",
                                              "PYTHONPATH", "PYTHONSTARTUP", "NODE_OPTIONS", "GIT_SSH_COMMAND",
                                              "DYLD_INSERT_LIBRARIES", "PERL5OPT", "JAVA_TOOL_OPTIONS")),
])
def test_switchboard_agent_env_refuses_secrets_and_anything_that_is_not_a_name(names, says):
    with pytest.raises(AgentEnvError, match=says):
        parse_agent_env(names)
    with pytest.raises(ValueError, match=says):
        RunsConfig(agent_env=tuple(names.split(",")))


def test_switchboard_agent_env_names_are_trimmed_deduplicated_and_blank_means_none():
    assert parse_agent_env(None) == parse_agent_env("") == parse_agent_env(" , ") == ()
    assert parse_agent_env(" HTTPS_PROXY, SSL_CERT_FILE ,HTTPS_PROXY") == ("HTTPS_PROXY", "SSL_CERT_FILE")
    assert RunsConfig(agent_env=(" SSL_CERT_FILE ", "")).agent_env == ("SSL_CERT_FILE",)


def test_every_variable_settings_reads_a_secret_from_is_withheld_from_the_agent():
    from bot.settings import SECRET_VARIABLES

    assert SECRET_VARIABLES <= BOT_SECRET_VARIABLES
    assert set(BOT_SECRETS) <= BOT_SECRET_VARIABLES
    assert not BOT_SECRET_VARIABLES & AGENT_ENV_NAMES
    assert not any(name.startswith(AGENT_ENV_PREFIXES) for name in BOT_SECRET_VARIABLES)


async def test_stop_terminates_the_whole_process_group(tmp_path):
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    vt = VirtualClock(1_750_000_000.0)
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
    vt = VirtualClock(1_750_000_000.0)
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


SHELL_AGENT = ("/bin/sh", "-c", 'pwd; ls -A; cat .env 2>&1; echo "task: $1"', "agent", "{task}")


async def test_the_agent_starts_in_a_work_folder_of_its_own_not_beside_switchboards_env(tmp_path, monkeypatch):
    switchboard = tmp_path / "switchboard"  # where `switchboard run` was started, its .env beside it
    switchboard.mkdir()
    (switchboard / ".env").write_text(f"DISCORD_BOT_TOKEN={BOT_SECRETS['DISCORD_BOT_TOKEN']}\n")
    monkeypatch.chdir(switchboard)
    work = tmp_path / "home" / "agent-work"
    agent = CommandLane(RunsConfig(command=SHELL_AGENT, workdir=work), env=operator_environment(tmp_path))
    finished = await run_to_end(agent, ticket("cat .env"))
    assert finished.output.splitlines()[0] == str(work)  # the real process's working folder
    assert "No such file" in finished.output and BOT_SECRETS["DISCORD_BOT_TOKEN"] not in finished.output
    assert work.stat().st_mode & 0o777 == 0o700
    default = CommandLane(RunsConfig(command=SHELL_AGENT), env=operator_environment(tmp_path))
    own = (await run_to_end(default, ticket("cat .env"))).output.splitlines()[0]
    assert own != str(switchboard) and Path(own).name.startswith("switchboard-agent-")  # a private temp folder
    await default.aclose()
    assert not Path(own).exists()  # left empty by the agent, it goes with the lane


async def test_a_work_folder_that_cannot_be_made_is_a_lane_error_naming_it(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    agent = CommandLane(RunsConfig(command=SHELL_AGENT, workdir=tmp_path / "file" / "work"))
    with pytest.raises(LaneError, match="cannot use the agent's work folder .*file/work"):
        await agent.start(ticket())


@pytest.mark.parametrize("extra", ["DISCORD_BOT_TOKEN", "discord_bot_token", "LD_PRELOAD", "SWITCHBOARD_MODEL"])
def test_child_environment_checks_the_extra_names_itself(extra):
    """A lane built around the settings (or a test) may hand `child_environment` names nobody checked."""
    env = {"PATH": "/bin", extra: "value-the-agent-must-not-get"}
    with pytest.raises(AgentEnvError):
        child_environment(env, (extra,))


async def test_a_relative_agent_program_is_found_from_where_switchboard_started(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "agent.sh"
    script.write_text('#!/bin/sh\necho "ran: $1 in $(pwd)"\n')
    script.chmod(0o755)
    agent = CommandLane(RunsConfig(command=("./bin/agent.sh", "{task}"), workdir=tmp_path / "work"))
    finished = await run_to_end(agent, ticket("hello"))
    assert finished.output.strip() == f"ran: hello in {tmp_path / 'work'}"
