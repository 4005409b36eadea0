"""The doubles the runs tests share (tests/support/runs.py, tests/support/clock.py) behave as those
tests assume."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from tests.support.clock import VirtualClock
from tests.support.runs import FAKE_AGENT, ProcessWatch, agent_command, read_fifo

# -- the doubles themselves ------------------------------------------------------------------------

async def test_virtual_sleep_wakes_only_when_time_is_advanced_past_its_deadline():
    vt = VirtualClock(1_750_000_000.0)
    woke: list[str] = []

    async def nap(name: str, delay: float) -> None:
        await vt.sleep(delay)
        woke.append(name)

    tasks = [asyncio.create_task(nap("short", 5)), asyncio.create_task(nap("long", 120))]
    await vt.wait_sleeper(lambda d: d == 120)
    vt.advance(4)
    await asyncio.sleep(0)
    assert woke == []
    vt.advance(1)
    await tasks[0]
    assert woke == ["short"] and vt.pending() == [115]
    vt.advance(115)
    await tasks[1]
    assert woke == ["short", "long"]


async def test_fake_agent_hang_reports_both_pids_and_dies_with_its_group(tmp_path):
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    proc = await asyncio.create_subprocess_exec(*agent_command("hang", "--ready", str(fifo))[:-1], "task",
                                                stdout=asyncio.subprocess.DEVNULL, start_new_session=True)
    leader, child = (int(p) for p in (await read_fifo(fifo)).split())
    assert leader == proc.pid and child != leader
    assert os.getpgid(child) == proc.pid  # same group: a group kill reaches it
    watch = ProcessWatch(child)
    os.killpg(proc.pid, 15)
    await proc.wait()
    await watch.exited()


@pytest.mark.parametrize("mode,code", [("answer", 0), ("fail", 1)])
async def test_fake_agent_exit_codes(mode, code):
    proc = await asyncio.create_subprocess_exec(sys.executable, FAKE_AGENT, mode, "hello",
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == code
    assert (b"answer: hello" in out) if code == 0 else (b"refused" in err)
