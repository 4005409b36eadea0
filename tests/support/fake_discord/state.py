"""The fake Discord's shared state: accounts, the guild, registered commands, interactions in flight."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from .checks import DiscordError
from .journal import Journal
from .objects import EPHEMERAL, TEXT, VOICE, Channel, Guild, SimUser, Snowflakes


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
                 allowed_privileged_intents: int = 0) -> None:
        self.ids = Snowflakes()
        self.journal = journal
        self.token = token
        self.allowed_privileged_intents = allowed_privileged_intents
        self.owner = SimUser(self.ids(), "owner")
        self.application_id = self.ids()
        self.bot = SimUser(self.application_id, "switchboard", bot=True)  # bot user id = app id, as on Discord
        gid = self.ids()
        self.guild = Guild(gid, guild_name, self.owner.id, Channel(self.ids(), TEXT, "general", gid, 0),
                           Channel(self.ids(), VOICE, "Lounge", gid, 1))
        self.guild.members[self.owner.id] = self.owner
        self.guild.members[self.bot.id] = self.bot
        self.global_commands: list[dict] = []
        self.guild_commands: dict[int, list[dict]] = {}
        self.interactions: dict[int, PendingInteraction] = {}
        self.channel_failures: dict[int, DiscordError] = {}
        self.messages: list[dict] = []  # channel messages the bot created

    def new_user(self, username: str, nick: str | None = None) -> SimUser:
        user = SimUser(self.ids(), username, nick)
        self.guild.members[user.id] = user
        return user

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
