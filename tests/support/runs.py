"""Doubles for the runs tests: a runs service over a real store with virtual time (`harness`), a call
and a sink that record what they were given, the fake agent's command line, and process helpers.

    async with harness(tmp_path, lanes=("command",), command=agent_command("answer")) as h:
        await h.service.delegate("summarise the logs")
        await accepted(h, 1)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from common.store import open_store
from runs import MIGRATIONS, Delivery, RunsConfig, RunService
from runs.core import RunTicket
from tests.support.clock import VirtualClock
from tests.support.fake_hermes import FakeHermes
from tests.support.paths import FAKE_AGENT

KEY = "sk-hermes-test"  # the fake Hermes api_server's key
SAFETY_S = 15.0  # a hang guard only: nothing is asserted about how long anything took


def agent_command(mode: str, *extra: str) -> tuple[str, ...]:
    return (sys.executable, FAKE_AGENT, mode, *extra, "{task}")


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Harness:
    def __init__(self, service: RunService, vt: VirtualClock, sink: RecordingSink, call: RecordingCall) -> None:
        self.service, self.vt, self.sink, self.call = service, vt, sink, call

    async def until(self, run_id: int, predicate):
        return await asyncio.wait_for(self.service.wait_until(run_id, predicate), SAFETY_S)

    async def delivered(self, run_id: int):
        return await self.until(run_id, lambda t: t.delivery is Delivery.DELIVERED)

    async def notes(self, run_id: int, predicate):
        return await asyncio.wait_for(self.service.wait_receipts(run_id, predicate), SAFETY_S)


@contextlib.asynccontextmanager
async def harness(tmp_path, *, fake: FakeHermes | Any = None, lanes=("hermes-api", "command"),
                  command=None, vt: VirtualClock | None = None, owner: str | None = None, attach: bool = True,
                  crash: bool = False, secrets: tuple[str, ...] = (), hold_delivery_s: float = 0.0,
                  database_url: str | None = None, **config) -> AsyncIterator[Harness]:
    """`fake`: a FakeHermes, or anything with a `.url` (a RealHermes, with `hermes_key=REAL_KEY`)."""
    vt = vt or VirtualClock(1_750_000_000.0)
    url = fake.url if fake else f"http://127.0.0.1:{free_port()}"
    cfg = RunsConfig(lanes=tuple(lanes), hermes_url=url, hermes_key=config.pop("hermes_key", KEY),
                     command=tuple(command or agent_command("answer")), **config)
    store = await open_store(tmp_path / "home", MIGRATIONS, database_url=database_url)
    sink, call = RecordingSink(), RecordingCall()
    service = RunService(store, cfg, sink=sink, clock=vt.clock, sleep=vt.sleep, owner=owner, secrets=secrets,
                         hold_delivery_s=hold_delivery_s)
    if attach:
        service.attach(call)
    await service.start()
    try:
        yield Harness(service, vt, sink, call)
    finally:
        await service.close(settle_unwatchable=not crash)
        await store.close()


async def accepted(h: Harness, run_id: int):
    return await h.until(run_id, lambda t: t.external_id is not None or t.terminal)
