"""Point an unmodified discord.py at the fake: its REST base and its gateway URL are class attributes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import discord
import discord.gateway
import discord.http
import yarl


@contextlib.contextmanager
def point_discord_py(api_base: str, gateway_url: str) -> Iterator[None]:
    """Within the block, discord.py talks to `api_base` (REST) and dials `gateway_url` (a plain
    `Client` never asks `GET /gateway`). Voice follows VOICE_SERVER_UPDATE's endpoint by itself."""
    route, ws = discord.http.Route, discord.gateway.DiscordWebSocket
    old = route.BASE, ws.DEFAULT_GATEWAY
    route.BASE, ws.DEFAULT_GATEWAY = api_base, yarl.URL(gateway_url)
    try:
        yield
    finally:
        route.BASE, ws.DEFAULT_GATEWAY = old


def point_discord_py_at(fake: object) -> contextlib.AbstractContextManager[None]:
    """`point_discord_py` with a running `FakeDiscord`'s URLs."""
    return point_discord_py(fake.api_base, fake.gateway.url)  # type: ignore[attr-defined]


async def shut_down_like_ctrl_c(client: discord.Client, runner: asyncio.Task) -> None:
    """What `Client.run` does on Ctrl-C: the running `start()` is cancelled, then `close()`."""
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    await client.close()


@contextlib.asynccontextmanager
async def gateway_client(fake: object, client: discord.Client | None = None, *,
                         timeout: float = 30.0) -> AsyncIterator[discord.Guild]:
    """`client` (default: a plain one) started on the fake — REST and gateway — once discord.py has
    cached the guild; shut down as Ctrl-C would on the way out."""
    client = client or discord.Client(intents=discord.Intents.default())
    available = asyncio.get_running_loop().create_future()

    @client.event
    async def on_guild_available(guild: discord.Guild) -> None:
        if not available.done():
            available.set_result(guild)

    with point_discord_py_at(fake):
        runner = asyncio.create_task(client.start(fake.token))  # type: ignore[attr-defined]
        try:
            yield await asyncio.wait_for(available, timeout)
        finally:
            await shut_down_like_ctrl_c(client, runner)
