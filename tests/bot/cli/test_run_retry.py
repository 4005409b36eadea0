"""`switchboard run` started before Discord can be reached (the network not up yet, an outage): it says
so, retries with backoff, and serves once Discord answers; Ctrl-C while it waits is a clean exit 0.

"Down" is a loopback port nobody listens on (the kernel refuses the connection, as for a network that
is not up); "up" is the fake Discord. The waits between attempts are injected: nothing sleeps."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

from bot.cli import run as run_cli
from bot.cli.run import serve
from tests.support.discord_service import settings_for
from tests.support.fake_discord import FakeDiscord, point_discord_py, point_discord_py_at
from tests.support.runs import SAFETY_S


@contextlib.contextmanager
def discord_down() -> Iterator[None]:
    """discord.py pointed at a loopback port that refuses every connection."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: a connect is refused
        port = sock.getsockname()[1]
        with point_discord_py(f"http://127.0.0.1:{port}/api/v10", f"ws://127.0.0.1:{port}/"):
            yield


async def test_run_says_discord_is_unreachable_retries_with_backoff_and_serves_once_it_is_up(tmp_path, capsys):
    async with FakeDiscord() as fake:
        operator = fake.add_user("olive", nick="Olive")
        stopping, ready = asyncio.Event(), asyncio.get_running_loop().create_future()
        waits: list[float] = []
        with contextlib.ExitStack() as up, discord_down():
            async def pause(seconds: float, _stopping: asyncio.Event) -> bool:
                waits.append(seconds)
                if len(waits) == 3:  # Discord comes up during the third wait
                    up.enter_context(point_discord_py_at(fake))
                return False

            task = asyncio.create_task(serve(settings_for(tmp_path, fake, operator), stopping, ready, pause=pause))
            try:
                await asyncio.wait_for(fake.wait_gateway_ready(), SAFETY_S)
                await asyncio.wait_for(ready, SAFETY_S)
            finally:
                stopping.set()
                code = await asyncio.wait_for(task, 15)
        err = capsys.readouterr().err
    assert code == 0
    assert waits == [1.0, 2.0, 4.0]  # backoff: doubling
    lines = [line for line in err.splitlines() if line.startswith("switchboard run:")]
    assert [line.split("retrying in ")[-1] for line in lines[:3]] == [f"{s} s (Ctrl-C to stop)" for s in (1, 2, 4)]
    assert all("cannot reach Discord (ClientConnectorError" in line for line in lines[:3]), lines
    assert lines[3] == "switchboard run: reached Discord"
    assert "Traceback" not in err and fake.token not in err
    fake.assert_clean()


async def test_ctrl_c_while_waiting_for_discord_exits_0(tmp_path, capsys):
    async with FakeDiscord() as fake:  # for the settings only: discord.py never reaches it
        stopping = asyncio.Event()
        waiting = asyncio.Event()

        async def pause(seconds: float, stopping_: asyncio.Event) -> bool:
            waiting.set()
            return await run_cli._pause(seconds, stopping_)  # the real wait, which a stop cuts short

        with discord_down():
            task = asyncio.create_task(serve(settings_for(tmp_path, fake, None), stopping, pause=pause))
            await asyncio.wait_for(waiting.wait(), SAFETY_S)
            stopping.set()  # what SIGINT/SIGTERM do
            code = await asyncio.wait_for(task, 15)
    assert code == 0
    err = capsys.readouterr().err
    assert "retrying in 1 s" in err and "Traceback" not in err
