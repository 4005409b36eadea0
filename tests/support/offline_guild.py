"""A server as discord.py itself holds it, with no gateway: the fake Discord's GUILD_CREATE payload
(`fake_discord.objects`, the shapes discord.py 2.7.1 parses) handed to discord.py's own `Guild`, and a
`Client` with the bot's intents, logged in as the fake's bot user. For unit tests of code that reads guilds, channels, members
and voice states (who is in a call), without the real-time rig."""

from __future__ import annotations

import discord

from bot.discord.client import intents
from tests.support.fake_discord.objects import TEXT, VOICE, Channel, Guild, SimUser, Snowflakes


class OfflineServer:
    def __init__(self, ids: Snowflakes | None = None) -> None:
        self.ids = ids or Snowflakes()
        self.owner = SimUser(self.ids(), "owner")
        self.bot = SimUser(self.ids(), "switchboard", bot=True)
        gid = self.ids()
        self.world = Guild(gid, "Switchboard HQ", self.owner.id, Channel(self.ids(), TEXT, "general", gid, 0),
                           Channel(self.ids(), VOICE, "Lounge", gid, 1))
        for user in (self.owner, self.bot):
            self.world.members[user.id] = user
        self.client = discord.Client(intents=intents())  # the bot's own: guilds and voice states
        state = self.client._connection
        state.user = discord.ClientUser(state=state, data=self.bot.user_payload())  # as after READY

    @property
    def voice_channel_id(self) -> int:
        return self.world.voice_channel.id

    def member(self, username: str, *, bot: bool = False) -> SimUser:
        user = SimUser(self.ids(), username, bot=bot)
        self.world.members[user.id] = user
        return user

    def in_voice(self, *users: SimUser) -> None:
        for user in users:
            self.world.voice[user.id] = self.voice_channel_id

    def guild(self) -> discord.Guild:
        """The server as discord.py parses its GUILD_CREATE now (who is in voice included)."""
        return discord.Guild(data=self.world.create_payload(self.bot.id, voice_intent=True),  # type: ignore[arg-type]
                             state=self.client._connection)
