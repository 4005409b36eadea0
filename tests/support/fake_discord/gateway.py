"""The main gateway (websocket at "/"): HELLO, heartbeats, IDENTIFY/RESUME, READY, GUILD_CREATE,
dispatches the test asks for, and the bot's voice state requests (op 4).

Compression is what the URL asks for: `compress=zlib-stream` gets one zlib stream with a
Z_SYNC_FLUSH per message in binary frames; no `compress` gets text frames. Close codes are
Discord's: 4001 unknown opcode, 4002 decode error, 4003 not authenticated, 4004 authentication
failed, 4005 already authenticated, 4010 invalid shard, 4011 sharding required, 4012 invalid API
version, 4013 invalid intents, 4014 disallowed (privileged) intents.

Several sessions may be identified at once (`Gateway.live`); each holds a shard (`shards.py`) and
gets READY, GUILD_CREATE and every guild event only for that shard's guilds, DMs on shard 0 only.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WSMsgType, web

from tests.support.fake_discord.journal import Frame
from tests.support.fake_discord.objects import VOICE
from tests.support.fake_discord.shards import INVALID_SHARD, SHARDING_REQUIRED, Sharding, shard_of
from tests.support.fake_discord.state import DiscordState

DISPATCH, HEARTBEAT, IDENTIFY, PRESENCE, VOICE_STATE, RESUME, RECONNECT = 0, 1, 2, 3, 4, 6, 7
REQUEST_MEMBERS, INVALID_SESSION, HELLO, HEARTBEAT_ACK = 8, 9, 10, 11
GUILDS_INTENT, VOICE_STATES_INTENT = 1 << 0, 1 << 7
PRIVILEGED_INTENTS = (1 << 1) | (1 << 8) | (1 << 15)  # members, presences, message content
HEARTBEAT_INTERVAL_MS = 41_250

DM_INTENT = 1 << 12  # DIRECT_MESSAGES
VoiceRequest = Callable[["GatewaySession", int, int | None, bool, bool], Awaitable[None]]


class GatewaySession:
    """One identified (or identifying) gateway connection."""

    def __init__(self, state: DiscordState, ws: web.WebSocketResponse, compress: bool) -> None:
        self.state, self.ws = state, ws
        self._zlib = zlib.compressobj() if compress else None
        self._send_lock = asyncio.Lock()
        self.seq = 0
        self.session_id: str | None = None
        self.identify: dict | None = None
        self.intents = 0
        self.shard = (0, 1)  # [shard_id, num_shards] from IDENTIFY
        self.sent_events: list[dict] = []  # dispatches, for RESUME replay
        self.resumed_elsewhere = False  # a newer connection RESUMEd this session

    @property
    def live(self) -> bool:
        """Identified, still connected, and not taken over by a RESUME."""
        return self.session_id is not None and not self.ws.closed and not self.resumed_elsewhere

    def holds(self, guild_id: int) -> bool:
        return shard_of(guild_id, self.shard[1]) == self.shard[0]

    @property
    def voice_intent(self) -> bool:
        return bool(self.intents & VOICE_STATES_INTENT)

    async def send(self, payload: dict) -> None:
        async with self._send_lock:  # one zlib stream: frames must leave in compression order
            text = json.dumps(payload)
            if self._zlib is None:
                await self.ws.send_str(text)
            else:
                await self.ws.send_bytes(self._zlib.compress(text.encode()) + self._zlib.flush(zlib.Z_SYNC_FLUSH))
        self.state.journal.frames.append(Frame("gateway", "out", payload["op"], payload.get("d"), payload.get("t")))
        self.state.journal.changed()

    async def dispatch(self, event: str, data: dict) -> None:
        self.seq += 1
        payload = {"op": DISPATCH, "t": event, "s": self.seq, "d": data}
        self.sent_events.append(payload)
        await self.send(payload)

    async def close(self, code: int, reason: str) -> None:
        self.state.journal.closed_by_fake.append(("gateway", code))
        await self.ws.close(code=code, message=reason.encode())


class Gateway:
    """Serves gateway connections; `current` is the bot's identified session."""

    def __init__(self, state: DiscordState, on_voice_request: VoiceRequest,
                 sharding: Sharding | None = None) -> None:
        self.state = state
        self.on_voice_request = on_voice_request
        self.sharding = sharding or Sharding(clock=state.clock)
        self.sessions: list[GatewaySession] = []
        self.current: GatewaySession | None = None
        self.url = ""  # set by the server once it listens

    def live(self, guild_id: int | None = None) -> list[GatewaySession]:
        """Sessions that receive `guild_id`'s events (its shard's), or DMs (shard 0) when None."""
        return [s for s in self.sessions if s.live and (s.holds(guild_id) if guild_id is not None
                                                        else s.shard[0] == 0)]

    async def dispatch(self, guild_id: int | None, event: str, data: dict, *, intent: int = 0) -> int:
        """Send a guild event (or a DM event when `guild_id` is None) to every session that gets it, as
        Discord does; with `intent`, only to sessions that asked for it. Returns how many got it."""
        sessions = [s for s in self.live(guild_id) if not intent or s.intents & intent]
        for session in sessions:
            await session.dispatch(event, data)
        return len(sessions)

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        query = request.query
        compress = query.get("compress")
        session = GatewaySession(self.state, ws, compress == "zlib-stream")
        self.sessions.append(session)
        if query.get("v") != "10" or query.get("encoding") != "json":
            await session.close(4012, "Invalid API version.")
            return ws
        if compress not in (None, "zlib-stream"):
            self.state.journal.violation(f"gateway compression {compress!r} is not implemented by the fake")
            await session.close(4000, "Unsupported compression.")
            return ws
        await session.send({"op": HELLO, "d": {"heartbeat_interval": HEARTBEAT_INTERVAL_MS}})
        try:
            await self._serve(session)
        finally:
            self.state.journal.closes.append(("gateway", ws.close_code))
            self.state.journal.changed()
        return ws

    async def _serve(self, session: GatewaySession) -> None:
        async for msg in session.ws:
            if msg.type is not WSMsgType.TEXT:
                await session.close(4002, "Error while decoding payload.")
                return
            try:
                payload = json.loads(msg.data)
                op, data = payload["op"], payload.get("d")
            except (ValueError, KeyError, TypeError):
                await session.close(4002, "Error while decoding payload.")
                return
            self.state.journal.frames.append(Frame("gateway", "in", op, data))
            self.state.journal.changed()
            if op == HEARTBEAT:
                await session.send({"op": HEARTBEAT_ACK, "d": None})
            elif op == IDENTIFY:
                if session.session_id is not None:
                    await session.close(4005, "Already authenticated.")
                    return
                if not await self._identify(session, data):
                    return
            elif op == RESUME:
                if not await self._resume(session, data):
                    return
            elif session.session_id is None:
                await session.close(4003, "Not authenticated.")
                return
            elif op == VOICE_STATE:
                await self._voice_state(session, data)
            elif op in (PRESENCE, REQUEST_MEMBERS):
                pass  # recorded above; nothing the fake needs to answer
            else:
                await session.close(4001, "Unknown opcode.")
                return

    async def _identify(self, session: GatewaySession, data: Any) -> bool:
        if not isinstance(data, dict) or data.get("token") != self.state.token:
            await session.close(4004, "Authentication failed.")
            return False
        intents = data.get("intents")
        if not isinstance(intents, int) or isinstance(intents, bool) or intents < 0:
            await session.close(4013, "Invalid intent(s).")
            return False
        if intents & PRIVILEGED_INTENTS & ~self.state.allowed_privileged_intents:
            await session.close(4014, "Disallowed intent(s).")
            return False
        props = data.get("properties") or {}
        if not all(isinstance(props.get(k), str) for k in ("os", "browser", "device")):
            self.state.journal.violation(f"IDENTIFY properties incomplete: {props}")
        outcome, shard = self.sharding.admit(data.get("shard"), [g.id for g in self.state.guilds])
        if outcome == "invalid_shard":
            await session.close(INVALID_SHARD, "Invalid shard.")
            return False
        if outcome == "sharding_required":
            await session.close(SHARDING_REQUIRED, "Sharding required.")
            return False
        if outcome == "invalid_session":  # over max_concurrency: identify again later
            await session.send({"op": INVALID_SESSION, "d": False})
            return True
        if outcome == "limit_spent":
            await self._spend_past_limit(session)
            return False
        session.identify, session.intents, session.shard = data, intents, shard
        session.session_id = secrets.token_hex(16)
        self.current = session
        guilds = [g for g in self.state.guilds if session.holds(g.id)]
        me = {**self.state.bot.user_payload(), "verified": True, "mfa_enabled": False, "flags": 0}
        ready = {
            "v": 10, "user": me, "guilds": [{"id": str(g.id), "unavailable": True} for g in guilds],
            "session_id": session.session_id, "resume_gateway_url": self.url,
            "application": {"id": str(self.state.application_id), "flags": 0},
            "private_channels": [], "relationships": [], "presences": [], "user_settings": {},
            "guild_join_requests": [], "geo_ordered_rtc_regions": ["fake"],
        }
        if "shard" in data:  # READY echoes the shard when IDENTIFY sent one
            ready["shard"] = list(shard)
        await session.dispatch("READY", ready)
        if intents & GUILDS_INTENT:
            for guild in guilds:
                await session.dispatch("GUILD_CREATE", guild.create_payload(self.state.bot.id,
                                                                            voice_intent=session.voice_intent))
        return True

    async def _spend_past_limit(self, session: GatewaySession) -> None:
        """An IDENTIFY past the daily session start limit: Discord ends every session and resets the
        token (it documents no close code; the fake closes them with 4004)."""
        self.state.journal.violation("IDENTIFY past session_start_limit.remaining: Discord would end every "
                                     "session and reset the bot token")
        for other in [s for s in self.sessions if s.live]:
            await other.close(4004, "Authentication failed.")
        await session.close(4004, "Authentication failed.")

    async def _resume(self, session: GatewaySession, data: Any) -> bool:
        data = data if isinstance(data, dict) else {}
        old = next((s for s in self.sessions if s.session_id and s.session_id == data.get("session_id")), None)
        if data.get("token") != self.state.token:
            await session.close(4004, "Authentication failed.")
            return False
        if old is None or not isinstance(data.get("seq"), int):
            await session.send({"op": INVALID_SESSION, "d": False})
            return True
        session.session_id, session.identify, session.intents = old.session_id, old.identify, old.intents
        session.shard, session.seq, session.sent_events = old.shard, old.seq, old.sent_events
        for earlier in self.sessions:  # RESUME is free: it takes nothing from the session start limit
            if earlier is not session and earlier.session_id == old.session_id:
                earlier.resumed_elsewhere = True
        self.current = session
        for event in [e for e in old.sent_events if e["s"] > data["seq"]]:
            await session.send(event)
        await session.dispatch("RESUMED", {})
        return True

    async def _voice_state(self, session: GatewaySession, data: Any) -> None:
        guild = self.state.guild_by_id(_snowflake(data.get("guild_id"))) if isinstance(data, dict) else None
        if guild is not None and not session.holds(guild.id):
            self.state.journal.violation(f"gateway op 4 for guild {guild.id} on shard {list(session.shard)}, which "
                                         "does not hold it (op 4 goes out on the guild's shard)")
            return
        ok = guild is not None and all(isinstance(data.get(k), bool) for k in ("self_mute", "self_deaf"))
        channel_id = _snowflake(data.get("channel_id")) if ok and data.get("channel_id") is not None else None
        channel = guild.channel(channel_id) if channel_id is not None else None
        if not ok or (channel_id is not None and (channel is None or channel.type != VOICE)):
            self.state.journal.violation(f"gateway op 4 Discord would ignore: {data}")
            return
        await self.on_voice_request(session, guild.id, channel_id, data["self_mute"], data["self_deaf"])

    async def request_reconnect(self) -> None:
        """Op 7: the bot closes, reconnects to `resume_gateway_url` and RESUMEs."""
        assert self.current is not None, "no gateway session"
        await self.current.send({"op": RECONNECT, "d": None})


def _snowflake(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None
