"""`switchboard runs list|show|stop` over the same store, without a call."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import socket
import unicodedata

from bot.cli.runs import add_parser, main
from bot.settings import check_settings
from runs import RunsConfig, RunState
from runs.procs import process_token
from tests.support.fake_hermes import FakeHermes
from tests.support.runs import KEY, ProcessWatch, accepted, agent_command, harness, read_fifo
from tests.support.store import recorded_home


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="switchboard")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["runs", *argv])


async def cli(tmp_path, *argv: str, config: RunsConfig | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()

    async def no_wait(delay: float) -> None:
        await asyncio.sleep(0)

    settings = check_settings({"SWITCHBOARD_HOME": str(tmp_path / "home")}).settings
    code = await main(parse(*argv), settings, config=config or RunsConfig(lanes=("command",)), out=out, err=err,
                      sleep=no_wait)
    return code, out.getvalue(), err.getvalue()


def live_other_process_owner() -> str:
    """An owner token naming a live process other than this one (as a running bot would be)."""
    return f"{socket.gethostname()}:{process_token(os.getppid())}:bot"


async def test_list_and_show_read_the_store_as_text_and_json(tmp_path):
    async with harness(tmp_path, lanes=("command",), command=agent_command("answer")) as h:
        await h.service.delegate("summarise the logs", requester_id=4242, origin="call-7")
        await h.delivered(1)
    code, out, err = await cli(tmp_path, "list")
    assert code == 0 and err == ""
    assert "completed" in out.splitlines()[1] and "summarise the logs" in out
    code, out, _ = await cli(tmp_path, "list", "--json")
    runs = json.loads(out)
    assert code == 0 and runs[0]["run"] == 1 and runs[0]["state"] == "completed" and runs[0]["requester_id"] == 4242
    code, out, _ = await cli(tmp_path, "show", "1")
    assert code == 0 and "run 1: finished on command" in out and "answer: summarise the logs" in out
    assert "announced in a call" in out and "state: starting -> running" in out
    assert "  started in: voice call call-7" in out.splitlines()
    code, out, _ = await cli(tmp_path, "show", "1", "--json")
    shown = json.loads(out)
    assert shown["output"].strip() == "answer: summarise the logs" and shown["delivery"] == "delivered"
    assert shown["origin"] == "call-7"
    assert [e["kind"] for e in shown["events"]][:2] == ["created", "state"]


async def test_an_unknown_run_number_is_one_clear_line_and_exit_2(tmp_path):
    await recorded_home(tmp_path / "home")
    for argv in (("show", "9"), ("stop", "9"), ("show", "#9")):
        code, out, err = await cli(tmp_path, *argv)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
        assert "there is no run" in err


async def test_stop_of_a_run_a_live_service_watches_leaves_settling_to_that_service(tmp_path):
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    hang = agent_command("hang", "--ready", str(fifo))
    async with harness(tmp_path, lanes=("command",), command=hang, owner=live_other_process_owner()) as h:
        await h.service.delegate("watch the logs")
        leader, child = (int(p) for p in (await read_fifo(fifo)).split())
        watches = [ProcessWatch(leader), ProcessWatch(child)]
        await accepted(h, 1)
        code, out, err = await cli(tmp_path, "stop", "1", "--reason", "enough", config=RunsConfig(
            lanes=("command",), command=hang))
        assert code == 0 and out.strip() == "stopping run 1 (command says stopping)", err
        done = await h.delivered(1)  # the watching service saw the kill and the recorded stop
        assert done.state is RunState.CANCELLED and done.error == "stopped: enough"
        assert h.call.said == ["Run 1 (watch the logs) was stopped."]
        for watch in watches:
            await watch.exited()


async def test_stop_of_an_unwatched_command_run_settles_it(tmp_path):
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    hang = agent_command("hang", "--ready", str(fifo))
    async with harness(tmp_path, lanes=("command",), command=hang, crash=True) as h:
        await h.service.delegate("watch the logs")
        leader = ProcessWatch(int((await read_fifo(fifo)).split()[0]))
        await accepted(h, 1)
    # the service that started it is gone (a crash: nothing was marked)
    code, out, _ = await cli(tmp_path, "list")
    assert "(not watched)" in out
    code, out, _ = await cli(tmp_path, "stop", "1", "--json", config=RunsConfig(lanes=("command",), command=hang))
    assert code == 0 and json.loads(out)["state"] == "stopping"
    await leader.exited()
    code, out, _ = await cli(tmp_path, "show", "1", "--json")
    assert json.loads(out)["state"] == "cancelled" and json.loads(out)["delivery"] == "pending"


async def test_stop_of_an_api_run_asks_hermes_and_records_what_it_says(tmp_path):
    async with FakeHermes(key=KEY) as fake:
        async with harness(tmp_path, fake=fake, crash=True) as h:
            await h.service.delegate("audit the auth module")
            await accepted(h, 1)
        config = RunsConfig(hermes_url=fake.url, hermes_key=KEY)
        code, out, err = await cli(tmp_path, "stop", "1", config=config)
        assert code == 0 and "hermes-api says stopping" in out, err
        code, out, _ = await cli(tmp_path, "show", "1", "--json")
        assert json.loads(out)["state"] == "cancelled"
        code, out, err = await cli(tmp_path, "stop", "1", config=config)
        assert code == 0 and out.strip() == "run 1 already stopped"
        fake.assert_clean()


# A task the agent echoes back: ANSI colours, an OSC 8 hyperlink, an OSC 52 clipboard write, a bidi
# override, and a line break that would forge a line of `runs show`.
HOSTILE_TASK = ("tidy \x1b[2J\x1b[31mred\x1b[0m \x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\ "
                "\x1b]52;c;ZWNobyBwd25lZA==\x07 \u202eeno\u202c\n  error: none")


async def test_list_and_show_print_the_agents_words_without_control_sequences(tmp_path):
    async with harness(tmp_path, lanes=("command",), command=agent_command("answer")) as h:
        await h.service.delegate(HOSTILE_TASK)
        await h.delivered(1)
    for argv in (("list",), ("show", "1")):
        code, out, _ = await cli(tmp_path, *argv)
        assert code == 0 and "red" in out and "click" in out  # the words are there, inert
        assert not any(unicodedata.category(c) in ("Cc", "Cf") for c in out.replace("\n", "")), repr(out)
    head = out.split("--- output")[0]  # the run's fields: one line each; the output below keeps its lines
    assert not any(line.startswith("  error:") for line in head.splitlines())  # no forged line
    assert "answer: tidy" in out and "ZWNobyBwd25lZA==" in out  # the agent's output, kept
    code, out, _ = await cli(tmp_path, "show", "1", "--json")
    assert json.loads(out)["task"] == HOSTILE_TASK and "\x1b" not in out  # JSON escapes it, exactly
