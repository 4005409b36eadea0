"""The fake's world (one guild, its channels, members and voice states) and Discord's JSON shapes.

Payloads follow Discord's API v10 objects as discord.py 2.7.1 parses them (`discord/types/*.py`);
ids are strings on the wire, as Discord sends them.
"""

from __future__ import annotations

import datetime
import itertools
from dataclasses import dataclass, field

DISCORD_EPOCH_MS = 1_420_070_400_000
# 2026-12-01T00:00:00Z: a fixed base keeps ids deterministic and ordered by creation.
_BASE_MS = 1_796_083_200_000 - DISCORD_EPOCH_MS

TEXT, VOICE, PUBLIC_THREAD, PRIVATE_THREAD = 0, 2, 11, 12  # channel types
REPLY = 19  # message type of a reply (a message with a default message_reference)
EPHEMERAL = 1 << 6
LOADING = 1 << 7
# Permission bits the fake enforces on the REST routes that need them.
ADMINISTRATOR, VIEW_CHANNEL, SEND_MESSAGES = 1 << 3, 1 << 10, 1 << 11
CREATE_PUBLIC_THREADS, CREATE_PRIVATE_THREADS, SEND_MESSAGES_IN_THREADS = 1 << 35, 1 << 36, 1 << 38
ALL_PERMISSIONS = (1 << 53) - 1
# What a plain member may do (Discord's @everyone defaults): create invite, add reactions, view, send,
# embed links, attach files, read history, connect, speak, voice activity, change nickname, use
# application commands, create public and private threads, send messages in threads.
MEMBER_PERMISSIONS = sum(1 << bit for bit in (0, 6, 10, 11, 14, 15, 16, 20, 21, 25, 26, 31, 35, 36, 38))
BOT_PERMISSIONS = MEMBER_PERMISSIONS


class Snowflakes:
    """Discord-shaped ids, strictly increasing: one millisecond per id from a fixed base."""

    def __init__(self) -> None:
        self._ms = itertools.count(_BASE_MS)

    def __call__(self) -> int:
        return next(self._ms) << 22


def iso_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


@dataclass
class SimUser:
    """A Discord account in the fake: a simulated person, or the bot itself."""

    id: int
    username: str
    nick: str | None = None
    bot: bool = False
    permissions: int = MEMBER_PERMISSIONS

    def user_payload(self) -> dict:
        return {"id": str(self.id), "username": self.username, "discriminator": "0",
                "global_name": None if self.bot else self.username.title(), "avatar": None,
                "bot": self.bot, "public_flags": 0}

    def member_payload(self, guild: Guild, *, with_permissions: bool = False) -> dict:
        member = {"user": self.user_payload(), "nick": self.nick, "avatar": None, "roles": [],
                  "joined_at": guild.created_at, "premium_since": None, "deaf": False, "mute": False,
                  "flags": 0, "pending": False, "communication_disabled_until": None}
        if with_permissions:  # interaction members carry their resolved permissions
            member["permissions"] = str(self.permissions)
        return member


@dataclass
class Channel:
    id: int
    type: int
    name: str
    guild_id: int
    position: int
    # Discord's overwrite objects: {"id", "type": 0 role | 1 member, "allow", "deny"} (bit sets as strings)
    permission_overwrites: list[dict] = field(default_factory=list)

    def payload(self) -> dict:
        data = {"id": str(self.id), "type": self.type, "name": self.name, "guild_id": str(self.guild_id),
                "position": self.position, "permission_overwrites": list(self.permission_overwrites),
                "parent_id": None,
                "nsfw": False, "flags": 0, "rate_limit_per_user": 0, "last_message_id": None}
        if self.type == VOICE:
            data.update(bitrate=64_000, user_limit=0, rtc_region=None)
        else:
            data["topic"] = None
        return data


@dataclass
class ThreadChannel:
    """A thread under a text channel, as Discord's channel object for threads (discord.py's `Thread` reads
    `parent_id`, `owner_id`, `message_count`, `member_count` and `thread_metadata` unconditionally)."""

    id: int
    type: int  # PUBLIC_THREAD or PRIVATE_THREAD
    name: str
    guild_id: int
    parent_id: int
    owner_id: int
    auto_archive_duration: int
    invitable: bool = True
    rate_limit_per_user: int = 0
    message_count: int = 0
    total_message_sent: int = 0
    last_message_id: int | None = None
    archived: bool = False
    locked: bool = False
    created_at: str = field(default_factory=iso_now)

    def payload(self) -> dict:
        metadata = {"archived": self.archived, "auto_archive_duration": self.auto_archive_duration,
                    "archive_timestamp": self.created_at, "locked": self.locked,
                    "create_timestamp": self.created_at}
        if self.type == PRIVATE_THREAD:
            metadata["invitable"] = self.invitable
        return {"id": str(self.id), "type": self.type, "guild_id": str(self.guild_id),
                "parent_id": str(self.parent_id), "owner_id": str(self.owner_id), "name": self.name,
                "last_message_id": _str_or_none(self.last_message_id),
                "rate_limit_per_user": self.rate_limit_per_user, "message_count": self.message_count,
                "member_count": 1, "total_message_sent": self.total_message_sent, "flags": 0,
                "thread_metadata": metadata}


@dataclass
class Guild:
    """The guild the bot is in: a text and a voice channel, members, who sits in which voice channel."""

    id: int
    name: str
    owner_id: int
    text_channel: Channel
    voice_channel: Channel
    members: dict[int, SimUser] = field(default_factory=dict)
    more_channels: list[Channel] = field(default_factory=list)  # added by the test (`FakeDiscord.add_text_channel`)
    threads: list[ThreadChannel] = field(default_factory=list)  # created by the bot (POST /channels/{id}/threads)
    voice: dict[int, int] = field(default_factory=dict)  # user id -> voice channel id
    voice_sessions: dict[int, str] = field(default_factory=dict)  # user id -> voice session id
    self_flags: dict[int, tuple[bool, bool]] = field(default_factory=dict)  # user id -> (self_mute, self_deaf)
    created_at: str = field(default_factory=iso_now)

    @property
    def channels(self) -> list[Channel]:
        return [self.text_channel, self.voice_channel, *self.more_channels]

    def channel(self, channel_id: int) -> Channel | None:
        return next((c for c in self.channels if c.id == channel_id), None)

    def thread(self, thread_id: int) -> ThreadChannel | None:
        return next((t for t in self.threads if t.id == thread_id), None)

    def permissions(self, user: SimUser, channel: Channel) -> int:
        """What `user` may do in `channel`, as Discord computes it: the member's guild permissions, then the
        channel's @everyone overwrite, then the member's own overwrite (members here have no roles)."""
        if user.id == self.owner_id:
            return ALL_PERMISSIONS
        allowed = user.permissions
        if allowed & ADMINISTRATOR:
            return ALL_PERMISSIONS
        for target in (str(self.id), str(user.id)):  # the @everyone role's id is the guild's
            for overwrite in channel.permission_overwrites:
                if overwrite["id"] == target:
                    allowed = (allowed & ~int(overwrite["deny"])) | int(overwrite["allow"])
        return allowed

    def everyone_role(self) -> dict:
        return {"id": str(self.id), "name": "@everyone", "color": 0, "hoist": False, "icon": None,
                "unicode_emoji": None, "position": 0, "permissions": str(MEMBER_PERMISSIONS),
                "managed": False, "mentionable": False, "flags": 0}

    def voice_state(self, user_id: int) -> dict:
        user = self.members[user_id]
        self_mute, self_deaf = self.self_flags.get(user_id, (False, False))
        return {"guild_id": str(self.id), "channel_id": _str_or_none(self.voice.get(user_id)),
                "user_id": str(user_id), "member": user.member_payload(self),
                "session_id": self.voice_sessions.get(user_id, ""), "deaf": False, "mute": False,
                "self_deaf": self_deaf, "self_mute": self_mute, "self_video": False, "suppress": False,
                "request_to_speak_timestamp": None}

    def create_payload(self, bot_id: int, *, voice_intent: bool) -> dict:
        """GUILD_CREATE: without GUILD_MEMBERS Discord sends only the bot and members in voice."""
        shown = {bot_id} | (set(self.voice) if voice_intent else set())
        states = [self.voice_state(uid) for uid in self.voice] if voice_intent else []
        for state in states:  # inside GUILD_CREATE, voice states omit guild_id and member
            state.pop("guild_id")
            state.pop("member")
        return {
            "id": str(self.id), "name": self.name, "icon": None, "splash": None, "discovery_splash": None,
            "owner_id": str(self.owner_id), "afk_channel_id": None, "afk_timeout": 300,
            "verification_level": 1, "default_message_notifications": 1, "explicit_content_filter": 0,
            "roles": [self.everyone_role()], "emojis": [], "stickers": [], "features": [],
            "mfa_level": 0, "application_id": None, "system_channel_id": str(self.text_channel.id),
            "system_channel_flags": 0, "rules_channel_id": None, "vanity_url_code": None,
            "description": None, "banner": None, "premium_tier": 0, "premium_subscription_count": 0,
            "preferred_locale": "en-US", "public_updates_channel_id": None, "nsfw_level": 0,
            "premium_progress_bar_enabled": False, "safety_alerts_channel_id": None,
            "joined_at": self.created_at, "large": False, "unavailable": False,
            "member_count": len(self.members), "voice_states": states,
            "members": [self.members[uid].member_payload(self) for uid in sorted(shown)],
            "channels": [c.payload() for c in self.channels],
            "threads": [t.payload() for t in self.threads if not t.archived], "presences": [],
            "stage_instances": [], "guild_scheduled_events": [], "soundboard_sounds": [],
        }


def _str_or_none(value: int | None) -> str | None:
    return None if value is None else str(value)


def message_payload(*, message_id: int, channel_id: int, guild_id: int | None, author: SimUser,
                    body: dict, message_type: int = 0, application_id: int | None = None,
                    flags: int = 0, replied_to: dict | None = None, position: int | None = None) -> dict:
    """A message as Discord returns it after creating it from a validated request `body`.

    `replied_to`: the (resolved) message this one replies to. Discord then answers type 19 (REPLY)
    with `message_reference` and `referenced_message`, and mentions the replied-to author unless
    `allowed_mentions` leaves `replied_user` out (or false). `position`: a message in a thread has its
    index there."""
    embeds = [{"type": "rich", **embed} for embed in body.get("embeds") or []]
    data = {"id": str(message_id), "channel_id": str(channel_id), "author": author.user_payload(),
            "content": body.get("content") or "", "timestamp": iso_now(), "edited_timestamp": None,
            "tts": bool(body.get("tts")), "mention_everyone": False, "mentions": [], "mention_roles": [],
            "attachments": [], "embeds": embeds, "pinned": False, "type": message_type,
            "flags": flags, "components": body.get("components") or []}
    if guild_id is not None:
        data["guild_id"] = str(guild_id)
    if position is not None:
        data["position"] = position
    if application_id is not None:
        data["application_id"] = data["webhook_id"] = str(application_id)
    if replied_to is not None:
        data["type"] = REPLY
        data["message_reference"] = {"type": 0, "message_id": replied_to["id"], "channel_id": replied_to["channel_id"],
                                     **({"guild_id": replied_to["guild_id"]} if "guild_id" in replied_to else {})}
        data["referenced_message"] = {k: v for k, v in replied_to.items() if k != "referenced_message"}
        mentions = body.get("allowed_mentions")
        if mentions is None or mentions.get("replied_user"):
            data["mentions"] = [replied_to["author"]]
    return data
