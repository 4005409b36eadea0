"""Shared doubles for the runs tests (virtual time, a recording call and sink, the fake agent), and
the tests that show those doubles behave as the other tests assume."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from runs.core import RunTicket

FAKE_AGENT = str(Path(__file__).parent / "support" / "fake_agent.py")
SAFETY_S = 15.0  # a hang guard only: nothing is asserted about how long anything took


def agent_command(mode: str, *extra: str) -> tuple[str, ...]:
    return (sys.executable, FAKE_AGENT, mode, *extra, "{task}")


class VirtualTime:
    """A clock and a `sleep` that only move when the test calls `advance`."""

    def __init__(self, start: float = 1_750_000_000.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, int, asyncio.Future]] = []
        self._seq = itertools.count()
        self._changed = asyncio.Condition()

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + max(0.0, delay), next(self._seq), future))
        async with self._changed:
            self._changed.notify_all()
        await future

    def pending(self) -> list[float]:
        """Remaining delays of everything asleep now."""
        return sorted(deadline - self.now for deadline, _, f in self._sleepers if not f.done())

    async def wait_sleeper(self, predicate: Callable[[float], bool] = lambda d: True) -> None:
        """Wait until something sleeps with a remaining delay that satisfies `predicate`."""
        async with self._changed:
            await self._changed.wait_for(lambda: any(predicate(d) for d in self.pending()))

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while self._sleepers and self._sleepers[0][0] <= self.now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)


class RecordingCall:
    """An announcer (a live call) that records what it was asked to say."""

    def __init__(self, *, spoken: bool = True) -> None:
        self.spoken = spoken
        self.said: list[str] = []
        self._changed = asyncio.Condition()

    async def announce(self, text: str) -> bool:
        self.said.append(text)
        async with self._changed:
            self._changed.notify_all()
        return self.spoken

    async def wait_said(self, fragment: str) -> str:
        async with self._changed:
            await self._changed.wait_for(lambda: any(fragment in s for s in self.said))
        return next(s for s in self.said if fragment in s)


class RecordingSink:
    def __init__(self) -> None:
        self.posted: list[RunTicket] = []

    async def post_run(self, ticket: RunTicket) -> None:
        self.posted.append(ticket)


async def read_fifo(path: Path) -> str:
    """Block (in a thread) until a writer opens the FIFO, and return what it wrote."""
    return await asyncio.wait_for(asyncio.to_thread(path.read_text), SAFETY_S)


class ProcessWatch:
    """Wakes when a process that is not our child exits (pidfd), without polling."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd = os.pidfd_open(pid)

    async def exited(self) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        loop.add_reader(self.fd, lambda: done.done() or done.set_result(None))
        try:
            await asyncio.wait_for(done, SAFETY_S)
        finally:
            loop.remove_reader(self.fd)
            os.close(self.fd)


# -- the doubles themselves ------------------------------------------------------------------------

async def test_virtual_sleep_wakes_only_when_time_is_advanced_past_its_deadline():
    vt = VirtualTime()
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
