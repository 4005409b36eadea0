"""A strict fake Discord on loopback for testing with the real discord.py (docs/testing-discord.md)."""

from .checks import DiscordError
from .interactions import NotInvocable
from .objects import EPHEMERAL, SimUser
from .pointing import point_discord_py, point_discord_py_at
from .server import FakeDiscord

__all__ = ["FakeDiscord", "DiscordError", "NotInvocable", "SimUser", "EPHEMERAL", "point_discord_py",
           "point_discord_py_at"]
