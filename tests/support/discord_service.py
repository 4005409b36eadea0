"""`switchboard run` in-process on the fake Discord (real discord.py), for tests of its commands:

    async with service(tmp_path) as svc:
        reply = await svc.command("talk status", user=svc.operator)

`olive` is the operator and `gus` a guest whose display name is also "Olive"; the command lane runs
the fake agent; the service stops with `stopping` and must exit 0 with the fake Discord clean. `readiness`
is what `/readyz` answers (a test may register drain steps on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

from bot.cli.run import serve
from bot.discord.client import SwitchboardBot
from bot.fleet.readiness import Readiness
from bot.settings import check_settings
from tests.support.fake_discord import FakeDiscord, SimUser, point_discord_py_at
from tests.support.runs import FAKE_AGENT, SAFETY_S

OPENAI_KEY = "sk-service-test-NEVER-SHOWN"


@dataclass
class Service:
    fake: FakeDiscord
    operator: SimUser
    guest: SimUser
    task: asyncio.Task
    stopping: asyncio.Event
    bot: SwitchboardBot

    async def command(self, command: str, options: dict | None = None, *, user: SimUser) -> dict:
        pending = await self.fake.send_interaction(command, options, user=user)
        response = await self.fake.wait_response(pending)
        if response["type"] == 5:  # deferred: the answer is the first follow-up
            await self.fake.journal.wait_for(lambda: pending.followups, SAFETY_S)
            return {"deferred": True, "flags": (response.get("data") or {}).get("flags", 0), **pending.followups[0]}
        return {"deferred": False, **response["data"]}


def settings_for(tmp_path, fake: FakeDiscord, operator: SimUser | None, **extra: str):
    variables = {"DISCORD_BOT_TOKEN": fake.token, "OPENAI_API_KEY": OPENAI_KEY,
                 "SWITCHBOARD_HOME": str(tmp_path / "home"), "SWITCHBOARD_AGENT_LANES": "command",
                 "SWITCHBOARD_AGENT_COMMAND": f"{sys.executable} {FAKE_AGENT} answer {{task}}",
                 "SWITCHBOARD_RUNS_CHANNEL_ID": str(fake.text_channel.id), **extra}
    if operator is not None:
        variables["SWITCHBOARD_OPERATOR_USER_IDS"] = str(operator.id)
    report = check_settings(variables)
    assert not report.problems, report.problems
    return report.settings


@contextlib.asynccontextmanager
async def service(tmp_path, *, operators: bool = True, guild_sync: bool = False, readiness: Readiness | None = None,
                  **extra: str) -> AsyncIterator[Service]:
    async with FakeDiscord() as fake:
        if guild_sync:
            extra["SWITCHBOARD_GUILD_IDS"] = str(fake.guild_id)
        operator, guest = fake.add_user("olive", nick="Olive"), fake.add_user("gus", nick="Olive")
        stopping, ready = asyncio.Event(), asyncio.get_running_loop().create_future()
        with point_discord_py_at(fake):
            task = asyncio.create_task(serve(settings_for(tmp_path, fake, operator if operators else None, **extra),
                                             stopping, ready, readiness=readiness))
            try:
                await asyncio.wait_for(fake.wait_gateway_ready(), SAFETY_S)
                bot = await asyncio.wait_for(ready, SAFETY_S)
                yield Service(fake, operator, guest, task, stopping, bot)
            finally:
                stopping.set()
                code = await asyncio.wait_for(task, 15)
        assert code == 0
        fake.assert_clean()
