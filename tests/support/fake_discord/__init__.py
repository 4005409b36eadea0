"""A strict fake Discord on loopback for testing with the real discord.py (docs/testing.md, "A fake Discord").

Its names load when first used: the bot processes the rig starts import only `pointing` (which points
discord.py here), not the server with its TLS, DAVE and speech machinery (~0.4 s of imports each)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.support.fake_discord.checks import DiscordError
    from tests.support.fake_discord.interactions import NotInvocable
    from tests.support.fake_discord.objects import EPHEMERAL, SimUser
    from tests.support.fake_discord.pointing import point_discord_py, point_discord_py_at
    from tests.support.fake_discord.server import FakeDiscord

_HOMES = {"DiscordError": "checks", "NotInvocable": "interactions", "EPHEMERAL": "objects", "SimUser": "objects",
          "point_discord_py": "pointing", "point_discord_py_at": "pointing", "FakeDiscord": "server"}

__all__ = ["FakeDiscord", "DiscordError", "NotInvocable", "SimUser", "EPHEMERAL", "point_discord_py",
           "point_discord_py_at"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
