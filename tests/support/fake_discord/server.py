"""`FakeDiscord`: REST + gateway on one loopback HTTP port, voice gateway (TLS) + UDP on others.

    async with FakeDiscord(voice=True, workdir=tmp_path) as fake:
        alice = fake.add_user("alice", nick="Ali")
        with point_discord_py_at(fake):           # or run a subprocess bot with fake.bot_env()
            ...client.start(fake.token)...
        pending = await fake.send_interaction("talk status", user=alice)
        response = await fake.wait_response(pending)
        fake.assert_clean()
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.support.fake_discord.checks import MISSING_PERMISSIONS, UNKNOWN_CHANNEL, DiscordError
from tests.support.fake_discord.gateway import (
    DM_INTENT,
    GUILDS_INTENT,
    VOICE_STATES_INTENT,
    Gateway,
    GatewaySession,
)
from tests.support.fake_discord.interactions import build_command_interaction
from tests.support.fake_discord.journal import Journal, RestCall
from tests.support.fake_discord.objects import TEXT, Channel, Guild, SimUser, ThreadChannel, message_payload
from tests.support.fake_discord.rest import API_PREFIX, RestApi, json_response
from tests.support.fake_discord.shards import Sharding
from tests.support.fake_discord.speech import Speaker, hear_bot
from tests.support.fake_discord.state import WRITE_LIMIT, WRITE_WINDOW_S, DiscordState, PendingInteraction
from tests.support.fake_discord.tls import make_certificate, server_context
from tests.support.fake_discord.voice_gateway import CLIENT_DISCONNECT, CLIENTS_CONNECT, SPEAKING, VoiceServer

HOST = "127.0.0.1"


class FakeDiscord:
    """A strict loopback Discord: one bot in one guild by default; more guilds, shards and sessions on
    request (docs/testing.md, "A fake Discord")."""

    def __init__(self, *, token: str = "fake-bot-token.Switchboard.0123456789", voice: bool = False,
                 workdir: Path | None = None, allowed_privileged_intents: int = 0,
                 clock: Callable[[], float] = time.monotonic, write_limit: int = WRITE_LIMIT,
                 write_window_s: float = WRITE_WINDOW_S, sharding: Sharding | None = None) -> None:
        """`clock` (seconds) times each channel's write limit: `write_limit` message creates and edits per
        `write_window_s`; share a virtual clock with the code under test to run its pacing without sleeping.
        `sharding`: what `GET /gateway/bot` answers and whether IDENTIFYs are rate-limited (`shards.py`;
        default one shard, the limit recorded but not enforced), timed by the same clock."""
        if voice and workdir is None:
            raise ValueError("voice=True needs a workdir for the TLS certificate")
        self.journal = Journal()
        self.state = DiscordState(token=token, journal=self.journal,
                                  allowed_privileged_intents=allowed_privileged_intents, clock=clock,
                                  write_limit=write_limit, write_window_s=write_window_s)
        self.sharding = sharding or Sharding(clock=clock)
        self.gateway = Gateway(self.state, self._on_bot_voice_request, self.sharding)
        self.voice = VoiceServer(self.state) if voice else None
        self.speakers: dict[int, Speaker] = {}
        self.cert_path: Path | None = None
        self.api_base = ""
        self._workdir = workdir
        self._runners: list[web.AppRunner] = []

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> FakeDiscord:
        app = web.Application()
        app.router.add_get("/", self.gateway.handle)
        app.router.add_get("/api/v10/gateway", self._get_gateway)
        app.router.add_get("/api/v10/gateway/bot", self._get_gateway)
        app.add_subapp(API_PREFIX, RestApi(self.state, on_thread_created=self._thread_created).app)
        port = await self._listen(app, None)
        self.api_base = f"http://{HOST}:{port}{API_PREFIX}"
        self.gateway.url = f"ws://{HOST}:{port}/"
        if self.voice is not None:
            self.cert_path, key_path = make_certificate(self._workdir)
            voice_app = web.Application()
            voice_app.router.add_get("/", self.voice.handle)
            voice_port = await self._listen(voice_app, server_context(self.cert_path, key_path))
            self.voice.endpoint = f"{HOST}:{voice_port}"
            await asyncio.get_running_loop().create_datagram_endpoint(lambda: self.voice.udp, local_addr=(HOST, 0))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.voice is not None and self.voice.udp.transport is not None:
            self.voice.udp.transport.close()
        for runner in reversed(self._runners):
            await runner.cleanup()

    async def _listen(self, app: web.Application, ssl_context: Any) -> int:
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, HOST, 0, ssl_context=ssl_context)
        await site.start()
        self._runners.append(runner)
        return site._server.sockets[0].getsockname()[1]

    async def _get_gateway(self, request: web.Request) -> web.Response:
        """`GET /gateway` and `GET /gateway/bot` (recorded in the journal like the other REST calls)."""
        bot = request.path.endswith("/bot")
        if bot and request.headers.get("Authorization") != f"Bot {self.token}":
            status, body = 401, {"message": "401: Unauthorized", "code": 0}
        else:
            status, body = 200, self.sharding.gateway_bot(self.gateway.url) if bot else {"url": self.gateway.url}
        self.journal.rest.append(RestCall(request.method, request.path, dict(request.query), dict(request.headers),
                                          None, status, body, at=self.state.clock()))
        self.journal.changed()
        return json_response(status, body)

    def bot_env(self) -> dict[str, str]:
        """Environment for `tests.support.fake_discord.bot_runner` (and SSL_CERT_FILE for voice)."""
        env = {"FAKE_DISCORD_API": self.api_base, "FAKE_DISCORD_GATEWAY": self.gateway.url,
               "FAKE_DISCORD_TOKEN": self.token}
        if self.cert_path is not None:
            env["SSL_CERT_FILE"] = str(self.cert_path)
        return env

    # -- the world ---------------------------------------------------------------------------

    @property
    def token(self) -> str:
        return self.state.token

    @property
    def bot(self) -> SimUser:
        return self.state.bot

    @property
    def guild_id(self) -> int:
        return self.state.guild.id

    @property
    def text_channel(self) -> Channel:
        return self.state.guild.text_channel

    @property
    def voice_channel(self) -> Channel:
        return self.state.guild.voice_channel

    def add_user(self, username: str, nick: str | None = None, guild: Guild | None = None) -> SimUser:
        """A member of `guild` (default: the first guild) the test can act as."""
        return self.state.new_user(username, nick, guild)

    @property
    def guilds(self) -> list[Guild]:
        return self.state.guilds

    async def add_guild(self, name: str, shard: tuple[int, int] | None = None) -> Guild:
        """Another guild the bot is in (its own "general" and "Lounge"), on `shard` (shard_id, num_shards)
        if given; sessions already connected on its shard get GUILD_CREATE, as when the bot is added to a
        server. Voice is served in the first guild only."""
        guild = self.state.add_guild(name, shard)
        for session in self.gateway.live(guild.id):
            if session.intents & GUILDS_INTENT:
                await session.dispatch("GUILD_CREATE", guild.create_payload(self.bot.id,
                                                                            voice_intent=session.voice_intent))
        return guild

    async def add_text_channel(self, name: str) -> Channel:
        """Another text channel in the guild; a connected bot hears CHANNEL_CREATE (the GUILDS intent)."""
        guild = self.state.guild
        channel = Channel(self.state.ids(), TEXT, name, guild.id, len(guild.channels))
        guild.more_channels.append(channel)
        await self.gateway.dispatch(guild.id, "CHANNEL_CREATE", channel.payload(), intent=GUILDS_INTENT)
        return channel

    def request_for(self, message: dict) -> RestCall:
        """The REST call that created channel message `message` (its body has what Discord does not echo
        back, such as `allowed_mentions`)."""
        return next(c for c in self.journal.rest if c.method == "POST" and isinstance(c.response, dict)
                    and c.response.get("id") == message["id"]
                    and c.path.endswith(f"/channels/{message['channel_id']}/messages"))

    @property
    def threads(self) -> list[ThreadChannel]:
        """Threads the bot created, oldest first."""
        return self.state.guild.threads

    def thread_messages(self, thread: ThreadChannel | int) -> list[dict]:
        """The messages in a thread, oldest first, each with its latest content (after edits)."""
        return self.state.thread_messages(thread.id if isinstance(thread, ThreadChannel) else thread)

    def edits_of(self, message: dict) -> int:
        """How many edits of `message` the fake accepted."""
        return self.state.message_edits.get(message["id"], 0)

    def post_as(self, user: SimUser, channel: Channel | ThreadChannel, content: str) -> dict:
        """A message by a simulated member in `channel` (Discord stores it; the bot gets no event)."""
        message = message_payload(message_id=self.state.ids(), channel_id=channel.id, guild_id=self.guild_id,
                                  author=user, body={"content": content})
        self.state.messages.append(message)
        return message

    async def _thread_created(self, thread: ThreadChannel) -> None:
        await self.gateway.dispatch(thread.guild_id, "THREAD_CREATE", {**thread.payload(), "newly_created": True},
                                    intent=GUILDS_INTENT)

    def fail_channel(self, channel_id: int, failure: str) -> None:
        """Make every request on a channel fail: "forbidden" (403 50013) or "unknown" (404 10003)."""
        self.state.channel_failures[channel_id] = {"forbidden": MISSING_PERMISSIONS,
                                                   "unknown": UNKNOWN_CHANNEL}[failure]

    # -- gateway -----------------------------------------------------------------------------

    async def wait_gateway_ready(self, timeout: float = 15.0) -> GatewaySession:
        """The bot's identified gateway session, once READY (and GUILD_CREATE) went out."""
        await self.journal.wait_for(lambda: self.journal.dispatched("READY"), timeout)
        return self.gateway.current

    async def send_interaction(self, command: str, options: dict[str, Any] | None = None, *,
                               user: SimUser, channel: Channel | None = None) -> PendingInteraction:
        """Dispatch INTERACTION_CREATE for a synced slash command, e.g. `send_interaction("talk status", user=u)`."""
        pending = build_command_interaction(self.state, command, options, user, channel or self.text_channel)
        await self._dispatch_interaction(pending)
        return pending

    async def send_autocomplete(self, command: str, options: dict[str, Any], *, focused: str, user: SimUser,
                                channel: Channel | None = None) -> PendingInteraction:
        """Dispatch an autocomplete INTERACTION_CREATE while `user` types option `focused` (its partial
        text in `options`); the answer is `{"type": 8, "data": {"choices": [...]}}`."""
        pending = build_command_interaction(self.state, command, options, user, channel or self.text_channel,
                                            focused=focused)
        await self._dispatch_interaction(pending)
        return pending

    async def _dispatch_interaction(self, pending: PendingInteraction) -> None:
        """INTERACTION_CREATE to every session on the guild's shard: each of them sees it; only the first
        callback is accepted (a second gets 400 with code 40060)."""
        sent = await self.gateway.dispatch(int(pending.payload["guild_id"]), "INTERACTION_CREATE", pending.payload)
        assert sent, "the bot has no gateway session on this guild's shard"

    async def send_dm(self, user: SimUser, content: str) -> dict:
        """`user` writes to the bot in a DM: MESSAGE_CREATE (no guild) to sessions on shard 0 with the
        DIRECT_MESSAGES intent (DMs carry their content without the message content intent)."""
        channel_id = self.state.dm_channels.setdefault(user.id, self.state.ids())
        message = message_payload(message_id=self.state.ids(), channel_id=channel_id, guild_id=None, author=user,
                                  body={"content": content})
        self.state.messages.append(message)
        await self.gateway.dispatch(None, "MESSAGE_CREATE", message, intent=DM_INTENT)
        return message

    async def wait_response(self, pending: PendingInteraction, timeout: float = 15.0) -> dict:
        """The bot's interaction callback body `{type, data}`."""
        await self.journal.wait_for(lambda: pending.response is not None, timeout)
        return pending.response

    async def voice_state_update(self, user: SimUser, channel_id: int | None) -> None:
        """Move a simulated user into (or out of) a voice channel and tell the bot's gateway."""
        guild = self.state.guild
        if channel_id is None:
            guild.voice.pop(user.id, None)
        else:
            guild.voice[user.id] = channel_id
            guild.voice_sessions[user.id] = self.state.new_token()[:32]
        await self.gateway.dispatch(guild.id, "VOICE_STATE_UPDATE", guild.voice_state(user.id),
                                    intent=VOICE_STATES_INTENT)  # none when the bot is down

    async def deny_bot(self, channel: Channel, permissions: int) -> None:
        """A member overwrite on `channel` denying the bot `permissions` (a bit set), sent as CHANNEL_UPDATE
        (which bots get with the GUILDS intent), as when an admin edits the channel."""
        channel.permission_overwrites.append({"id": str(self.bot.id), "type": 1, "allow": "0",
                                              "deny": str(permissions)})
        await self.gateway.dispatch(channel.guild_id, "CHANNEL_UPDATE", channel.payload())

    async def request_gateway_reconnect(self) -> None:
        await self.gateway.request_reconnect()

    async def _on_bot_voice_request(self, session: GatewaySession, guild_id: int, channel_id: int | None,
                                    self_mute: bool, self_deaf: bool) -> None:
        """Op 4: the bot has one voice state per guild, whichever session sent it. Every session on the
        guild's shard hears VOICE_STATE_UPDATE; VOICE_SERVER_UPDATE goes to the one that asked; a voice
        connection made under another gateway session is closed with 4014, as Discord does."""
        guild, bot = self.state.guild_by_id(guild_id), self.state.bot.id
        if channel_id is not None and (self.voice is None or guild is not self.state.guild):
            self.journal.violation("the bot joined voice but the fake serves voice only in its first guild and "
                                   "only when started with voice=True")
            return
        guild.self_flags[bot] = (self_mute, self_deaf)
        if channel_id is None:
            guild.voice.pop(bot, None)
            if self.voice is not None:
                self.voice.revoke_tokens()
        else:
            guild.voice[bot] = channel_id
            guild.voice_sessions[bot] = session.session_id
        if self.voice is not None and guild is self.state.guild:
            self.voice.disconnect_other_sessions(session.session_id)
        # Discord only tells sessions with GUILD_VOICE_STATES
        await self.gateway.dispatch(guild.id, "VOICE_STATE_UPDATE", guild.voice_state(bot), intent=VOICE_STATES_INTENT)
        if channel_id is not None:
            await session.dispatch("VOICE_SERVER_UPDATE", {"token": self.voice.issue_token(session.session_id),
                                                           "guild_id": str(guild.id),
                                                           "endpoint": self.voice.endpoint})

    async def move_voice_server(self) -> None:
        """VOICE_SERVER_UPDATE while connected (Discord moved the call): the bot must re-handshake."""
        holder = self.state.guild.voice_sessions.get(self.bot.id)
        session = next((s for s in self.gateway.live(self.guild_id) if s.session_id == holder), self.gateway.current)
        await session.dispatch("VOICE_SERVER_UPDATE", {"token": self.voice.issue_token(session.session_id),
                                                       "guild_id": str(self.guild_id),
                                                       "endpoint": self.voice.endpoint})

    # -- voice -------------------------------------------------------------------------------

    async def wait_bot_voice(self, timeout: float = 15.0) -> Any:
        """The bot's current voice session once SESSION_DESCRIPTION went out."""
        voice = self.voice
        return await self.journal.wait_for(lambda: voice.bot_session if voice.bot_session
                                           and voice.bot_session.described.is_set() else None, timeout)

    async def join_voice(self, user: SimUser) -> Speaker:
        """A simulated user enters the voice channel: gateway VOICE_STATE_UPDATE, op 11, DAVE round."""
        await self.voice_state_update(user, self.voice_channel.id)
        ssrc = self.voice.next_ssrc()
        if self.voice.bot_session is not None:
            await self.voice.bot_session.send_json(CLIENTS_CONNECT, {"user_ids": [str(user.id)]})
        speaker = self.speakers[user.id] = Speaker(user.id, ssrc, await self.voice.relay.add_user(user.id))
        return speaker

    async def leave_voice(self, user: SimUser) -> None:
        self.speakers.pop(user.id)
        await self.voice.relay.remove_user(user.id)
        if self.voice.bot_session is not None:
            await self.voice.bot_session.send_json(CLIENT_DISCONNECT, {"user_id": str(user.id)})
        await self.voice_state_update(user, None)

    async def speak(self, user: SimUser, opus_frames: list[bytes], *, announce: bool = True) -> None:
        """Relay a simulated user's Opus frames to the bot (op 5 SPEAKING first unless `announce=False`)."""
        session = self.voice.bot_session
        assert session is not None and session.described.is_set(), "the bot is not connected to voice"
        speaker = self.speakers[user.id]
        if announce:
            await session.send_json(SPEAKING, {"user_id": str(user.id), "ssrc": speaker.ssrc, "speaking": 1})
        for datagram in speaker.packets_for(session, opus_frames):
            self.voice.udp.send(session.ssrc, datagram)

    def hear_bot(self, listener: SimUser) -> tuple[list[bytes], int]:
        """What `listener` (a simulated member) decodes from everything the bot sent so far."""
        return hear_bot(self.voice.sessions, self.journal.udp, self.voice.relay.local[listener.id], self.bot.id)

    # -- records -----------------------------------------------------------------------------

    def rest_calls(self, method: str, path_suffix: str = "") -> list:
        return [c for c in self.journal.rest if c.method == method and c.path.endswith(path_suffix)]

    def assert_clean(self) -> None:
        """Fail if the bot did anything real Discord would have refused or not understood."""
        assert not self.journal.violations, "fake Discord saw protocol violations:\n" + "\n".join(
            self.journal.violations)


__all__ = ["FakeDiscord", "DiscordError"]
