"""The fake Discord's shared state: accounts, the guild, registered commands, interactions in flight,
messages (with their edits and pings), threads, and each channel's write limit."""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.support.fake_discord.checks import DiscordError, RateLimitError
from tests.support.fake_discord.journal import Journal
from tests.support.fake_discord.objects import (
    EPHEMERAL,
    TEXT,
    VOICE,
    Channel,
    Guild,
    SimUser,
    Snowflakes,
    ThreadChannel,
)
from tests.support.fake_discord.shards import shard_of

# Discord's shared per-channel write limit: message creates and edits in one channel (a thread is a
# channel) count together; the 6th within 5 s is answered 429 (code 20028).
WRITE_LIMIT, WRITE_WINDOW_S = 5, 5.0


@dataclass
class PendingInteraction:
    """An INTERACTION_CREATE the fake sent, and what the bot has answered so far."""

    id: int
    token: str
    user: SimUser
    channel_id: int
    payload: dict
    response: dict | None = None  # the callback body {type, data}
    original: dict | None = None  # the message the response created (type 4/5)
    followups: list[dict] = field(default_factory=list)
    edits: list[dict] = field(default_factory=list)


class DiscordState:
    """Everything the REST API, gateway and voice gateway agree on."""

    def __init__(self, *, token: str, journal: Journal, guild_name: str = "Switchboard HQ",
                 allowed_privileged_intents: int = 0, clock: Callable[[], float] = time.monotonic,
                 write_limit: int = WRITE_LIMIT, write_window_s: float = WRITE_WINDOW_S) -> None:
        self.ids = Snowflakes()
        self.journal = journal
        self.clock = clock  # seconds; only the write limit reads it (a test may share a virtual clock)
        self.write_limit, self.write_window_s = write_limit, write_window_s
        self._writes: dict[int, deque[float]] = {}
        self.token = token
        self.allowed_privileged_intents = allowed_privileged_intents
        self.owner = SimUser(self.ids(), "owner")
        self.application_id = self.ids()
        self.bot = SimUser(self.application_id, "switchboard", bot=True)  # bot user id = app id, as on Discord
        self.guilds: list[Guild] = []  # the first is `guild`, where voice is served; more with `add_guild`
        self.guild = self.add_guild(guild_name)
        self.global_commands: list[dict] = []
        self.guild_commands: dict[int, list[dict]] = {}
        self.interactions: dict[int, PendingInteraction] = {}
        self.channel_failures: dict[int, DiscordError] = {}
        self.messages: list[dict] = []  # channel and thread messages (the bot's, and any `FakeDiscord.post_as`)
        self.message_edits: dict[str, int] = {}  # message id -> edits accepted (PATCH /channels/…/messages/…)
        self.pinged: list[dict] = []  # {"message_id", "everyone", "users", "roles"} for each write that mentions
        self.rate_limited: list[int] = []  # channel id of every write refused with 429
        self.dm_channels: dict[int, int] = {}  # user id -> the id of their DM channel with the bot

    def add_guild(self, name: str, shard: tuple[int, int] | None = None) -> Guild:
        """A guild the bot is in, with a text channel "general" and a voice channel "Lounge"; with `shard`
        (shard_id, num_shards), one whose events go to that shard."""
        gid = self.ids()
        while shard is not None and shard_of(gid, shard[1]) != shard[0]:
            gid = self.ids()
        guild = Guild(gid, name, self.owner.id, Channel(self.ids(), TEXT, "general", gid, 0),
                      Channel(self.ids(), VOICE, "Lounge", gid, 1))
        guild.members[self.owner.id] = self.owner
        guild.members[self.bot.id] = self.bot
        self.guilds.append(guild)
        return guild

    def guild_by_id(self, guild_id: int | None) -> Guild | None:
        return next((g for g in self.guilds if g.id == guild_id), None)

    def guild_of_channel(self, channel_id: int) -> Guild:
        """The guild a channel or thread belongs to (the first guild when none has it)."""
        return next((g for g in self.guilds if g.channel(channel_id) or g.thread(channel_id)), self.guild)

    def new_user(self, username: str, nick: str | None = None, guild: Guild | None = None) -> SimUser:
        user = SimUser(self.ids(), username, nick)
        (guild or self.guild).members[user.id] = user
        return user

    def messageable(self, channel_id: int) -> Channel | ThreadChannel | None:
        return self.guild.channel(channel_id) or self.guild.thread(channel_id)

    def new_thread(self, parent: Channel, name: str, kind: int, auto_archive_duration: int, *,
                   invitable: bool = True, rate_limit_per_user: int = 0) -> ThreadChannel:
        thread = ThreadChannel(self.ids(), kind, name, self.guild.id, parent.id, self.bot.id, auto_archive_duration,
                               invitable=invitable, rate_limit_per_user=rate_limit_per_user)
        self.guild.threads.append(thread)
        return thread

    def thread_messages(self, thread_id: int) -> list[dict]:
        """The messages in a thread, oldest first, each with its latest content."""
        return [m for m in self.messages if m["channel_id"] == str(thread_id)]

    def take_write(self, channel_id: int) -> None:
        """Count a message create or edit in `channel_id`, or raise 429 when the channel's window is full."""
        now = self.clock()
        writes = self._writes.setdefault(channel_id, deque())
        while writes and writes[0] <= now - self.write_window_s:
            writes.popleft()
        if len(writes) >= self.write_limit:
            self.rate_limited.append(channel_id)
            retry_after = writes[0] + self.write_window_s - now
            raise RateLimitError(retry_after, limit=self.write_limit, reset_at=time.time() + retry_after,
                                 bucket=f"channel-writes-{channel_id}")
        writes.append(now)

    def find_message(self, channel_id: int, message_id: int) -> dict | None:
        """A (non-ephemeral) message in `channel_id`: one the bot posted, or an interaction's response
        or follow-up there."""
        candidates = list(self.messages)
        for pending in self.interactions.values():
            candidates += [m for m in (pending.original, *pending.followups) if m is not None]
        return next((m for m in candidates if m["id"] == str(message_id) and m["channel_id"] == str(channel_id)
                     and not (m.get("flags") or 0) & EPHEMERAL), None)

    def interaction_by_token(self, application_id: int, token: str) -> PendingInteraction | None:
        if application_id != self.application_id:
            return None
        return next((i for i in self.interactions.values() if i.token == token), None)

    def commands_for(self, guild_id: int | None) -> list[dict]:
        return self.global_commands if guild_id is None else self.guild_commands.get(guild_id, [])

    def register_commands(self, guild_id: int | None, commands: list[dict]) -> list[dict]:
        """Bulk overwrite; a command keeps its id when its name and type are unchanged (as on Discord)."""
        old = {(c["name"], c["type"]): c["id"] for c in self.commands_for(guild_id)}
        registered = []
        for command in commands:
            kind = command.get("type", 1)
            data = {"id": old.get((command["name"], kind)) or str(self.ids()),
                    "application_id": str(self.application_id), "version": str(self.ids()), "type": kind,
                    "name": command["name"], "name_localizations": command.get("name_localizations"),
                    "description": command.get("description", ""),
                    "description_localizations": command.get("description_localizations"),
                    "options": command.get("options") or [],
                    "default_member_permissions": command.get("default_member_permissions"),
                    "contexts": command.get("contexts"),
                    "integration_types": command.get("integration_types") or [0],
                    "nsfw": command.get("nsfw", False)}
            if guild_id is not None:
                data["guild_id"] = str(guild_id)
            registered.append(data)
        if guild_id is None:
            self.global_commands = registered
        else:
            self.guild_commands[guild_id] = registered
        return registered

    @staticmethod
    def new_token(prefix: str = "") -> str:
        return prefix + secrets.token_urlsafe(48)
