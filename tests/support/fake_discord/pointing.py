"""Point an unmodified discord.py at the fake: its REST base and its gateway URL are class attributes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
