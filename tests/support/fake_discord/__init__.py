"""A strict fake Discord on loopback for testing with the real discord.py (docs/testing-discord.md)."""

from tests.support.fake_discord.checks import DiscordError
from tests.support.fake_discord.interactions import NotInvocable
from tests.support.fake_discord.objects import EPHEMERAL, SimUser
from tests.support.fake_discord.pointing import point_discord_py, point_discord_py_at
from tests.support.fake_discord.server import FakeDiscord

__all__ = ["FakeDiscord", "DiscordError", "NotInvocable", "SimUser", "EPHEMERAL", "point_discord_py",
           "point_discord_py_at"]
