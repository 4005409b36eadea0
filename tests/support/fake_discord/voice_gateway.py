"""The voice gateway (websocket v8 over TLS) and its UDP endpoint (IP discovery, RTP).

Handshake as discord.py 2.7.1 drives it: IDENTIFY (checked against the token and gateway session
issued at op 4) → HELLO/READY (ssrc, ip, port, modes) → UDP IP discovery (answered at once, inside
the receive callback) → SELECT_PROTOCOL (mode must be offered, address must be the discovered one)
→ SESSION_DESCRIPTION (secret key, dave_protocol_version 1) → op 25 external sender → op 11 roster.
DAVE rounds are `DaveRelay`'s. Close codes are Discord's: 4001 unknown opcode, 4002 decode error,
4003 not authenticated, 4004 authentication failed, 4005 already authenticated, 4016 unknown
encryption mode, 4017 DAVE required.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import struct
from collections.abc import Coroutine
from typing import Any

from aiohttp import WSMsgType, web

from tests.support.fake_discord.dave_relay import DaveRelay
from tests.support.fake_discord.journal import Frame, Journal
from tests.support.fake_discord.state import DiscordState

IDENTIFY, SELECT_PROTOCOL, READY, HEARTBEAT, SESSION_DESCRIPTION, SPEAKING, HEARTBEAT_ACK = 0, 1, 2, 3, 4, 5, 6
RESUME, HELLO, CLIENTS_CONNECT, CLIENT_DISCONNECT = 7, 8, 11, 13
EXECUTE_TRANSITION, TRANSITION_READY, INVALID_COMMIT_WELCOME = 22, 23, 31
EXTERNAL_SENDER, KEY_PACKAGE, COMMIT_WELCOME = 25, 26, 28
MODES = ["aead_aes256_gcm_rtpsize", "aead_xchacha20_poly1305_rtpsize"]  # what Discord offers today
DISCOVERY_LENGTH = 74


class UdpEndpoint(asyncio.DatagramProtocol):
    """Voice UDP: answers IP discovery for known SSRCs, records the bot's RTP, sends to the bot."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.transport: asyncio.DatagramTransport | None = None
        self.known: set[int] = set()  # SSRCs handed out in READY
        self.addresses: dict[int, tuple[str, int]] = {}  # ssrc -> the bot's address, from discovery
        self.answered_early: set[int] = set()

    @property
    def port(self) -> int:
        return self.transport.get_extra_info("sockname")[1]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if data[:2] == b"\x00\x01":
            self._discovery(data, addr)
        elif len(data) >= 12 and data[0] >> 6 == 2 and struct.unpack(">I", data[8:12])[0] in self.known:
            self.journal.udp.append((struct.unpack(">I", data[8:12])[0], data))
            self.journal.changed()
        else:
            self.journal.violation(f"unexpected datagram from {addr}: {data[:16].hex()}")

    def _discovery(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) != DISCOVERY_LENGTH or struct.unpack(">H", data[2:4])[0] != 70:
            self.journal.violation(f"malformed IP discovery request: {data.hex()}")
            return
        ssrc = struct.unpack(">I", data[4:8])[0]
        if ssrc not in self.known:
            self.journal.violation(f"IP discovery for unknown SSRC {ssrc}")
            return
        if ssrc in self.answered_early:
            if addr != self.addresses[ssrc]:
                self.journal.violation(f"IP discovery for SSRC {ssrc} from {addr}, answered early to another socket")
            return
        self.reply(ssrc, addr)

    def reply(self, ssrc: int, addr: tuple[str, int]) -> None:
        """Send the 74-byte discovery response for `ssrc` to `addr` (the address the request came from)."""
        self.addresses[ssrc] = addr
        reply = struct.pack(">HHI", 2, 70, ssrc) + addr[0].encode().ljust(64, b"\0") + struct.pack(">H", addr[1])
        self.transport.sendto(reply, addr)

    def answer_early(self, ssrc: int, addr: tuple[str, int]) -> None:
        """Answer discovery before the request arrives (the request is then only checked)."""
        self.answered_early.add(ssrc)
        self.reply(ssrc, addr)

    def send(self, ssrc: int, datagram: bytes) -> None:
        self.transport.sendto(datagram, self.addresses[ssrc])


class VoiceSession:
    """One voice websocket from the bot."""

    def __init__(self, server: VoiceServer, ws: web.WebSocketResponse) -> None:
        self.server, self.ws = server, ws
        self.user_id = server.state.bot.id
        self.identified = False
        self.gateway_session_id = ""  # the main gateway session whose op 4 this connection follows
        self.ssrc = 0
        self.secret_key = b""
        self.mode = ""
        self.described = asyncio.Event()
        self._seq = 0
        self._lock = asyncio.Lock()
        self._transitions: set[int] = set()

    async def send_json(self, op: int, data: Any) -> None:
        async with self._lock:
            payload = {"op": op, "d": data}
            if op not in (HELLO, HEARTBEAT_ACK):
                self._seq += 1
                payload["seq"] = self._seq
            await self.ws.send_str(json.dumps(payload))
        self._record("out", op, data)

    async def send_binary(self, op: int, payload: bytes) -> None:
        async with self._lock:
            self._seq += 1
            await self.ws.send_bytes(struct.pack(">HB", self._seq, op) + payload)
        self._record("out", op, payload)

    def expect_transition(self, transition_id: int) -> None:
        self._transitions.add(transition_id)

    def _record(self, direction: str, op: int, data: Any) -> None:
        self.server.journal.frames.append(Frame("voice", direction, op, data))
        self.server.journal.changed()

    async def close(self, code: int, reason: str) -> None:
        self.server.journal.closed_by_fake.append(("voice", code))
        await self.ws.close(code=code, message=reason.encode())


class VoiceServer:
    """Voice websocket server + UDP endpoint + the voice channel's DAVE relay."""

    def __init__(self, state: DiscordState) -> None:
        self.state, self.journal = state, state.journal
        self.udp = UdpEndpoint(state.journal)
        self.relay = DaveRelay(state.guild.voice_channel.id, state.bot.id)
        self.sessions: list[VoiceSession] = []
        self.bot_session: VoiceSession | None = None
        self.endpoint = ""  # "127.0.0.1:port", set once listening
        self._tokens: dict[str, str] = {}  # voice token -> gateway session id it was issued to
        # When the bot re-handshakes on a socket the fake already knows, send the discovery reply
        # with READY, before the request: the earliest an "instant" answer can reach the bot.
        self.answer_discovery_early = False
        self._ssrcs = itertools.count(11_000, 17)
        self._tasks: set[asyncio.Task] = set()

    def issue_token(self, gateway_session_id: str) -> str:
        self._tokens.clear()  # a new VOICE_SERVER_UPDATE invalidates the previous token
        token = secrets.token_hex(8)
        self._tokens[token] = gateway_session_id
        return token

    def revoke_tokens(self) -> None:
        self._tokens.clear()

    def disconnect_other_sessions(self, gateway_session_id: str) -> None:
        """Op 4 from another gateway session moved the bot's voice state: Discord closes the older voice
        connections with 4014 ("Disconnected ... Should not reconnect"). In the background: the socket of
        a killed process may not be known dead yet, and a close waits for the peer's answer."""
        for session in self.sessions:
            if session.identified and not session.ws.closed and session.gateway_session_id != gateway_session_id:
                self.spawn(session.close(4014, "Disconnected."), "closing an older voice connection")

    def next_ssrc(self) -> int:
        return next(self._ssrcs)

    def spawn(self, coro: Coroutine, what: str) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                self.journal.violation(f"{what} failed: {t.exception()!r}")
        task.add_done_callback(done)

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        session = VoiceSession(self, ws)
        self.sessions.append(session)
        if request.query.get("v") != "8":
            self.journal.violation(f"voice gateway dialled with {request.query_string!r}, expected v=8")
        await session.send_json(HELLO, {"v": 8, "heartbeat_interval": 13_750})
        try:
            await self._serve(session)
        finally:
            self.journal.closes.append(("voice", ws.close_code))
            self.journal.changed()
            if self.bot_session is session:
                self.bot_session = None
            if session.identified:
                await self.relay.bot_gone(session)
        return ws

    async def _serve(self, session: VoiceSession) -> None:
        async for msg in session.ws:
            if msg.type is WSMsgType.BINARY:
                if not await self._binary(session, msg.data):
                    return
                continue
            if msg.type is not WSMsgType.TEXT:
                return
            try:
                payload = json.loads(msg.data)
                op, data = payload["op"], payload["d"]
            except (ValueError, KeyError, TypeError):
                await session.close(4002, "Failed to decode payload.")
                return
            session._record("in", op, data)
            if not session.identified and op != IDENTIFY:
                await session.close(4003, "Not authenticated.")
                return
            handler = {IDENTIFY: self._identify, SELECT_PROTOCOL: self._select_protocol,
                       HEARTBEAT: self._heartbeat, SPEAKING: self._speaking,
                       TRANSITION_READY: self._transition_ready}.get(op)
            if op == INVALID_COMMIT_WELCOME:
                self.journal.violation(f"the bot could not process a commit/welcome: {data}")
            elif handler is None:
                await session.close(4001, "Unknown opcode.")
                return
            elif not await handler(session, data):
                return

    async def _binary(self, session: VoiceSession, data: bytes) -> bool:
        op, payload = data[0], bytes(data[1:])
        session._record("in", op, payload)
        if not session.described.is_set():
            await session.close(4003, "Not authenticated.")
            return False
        if op == KEY_PACKAGE:
            self.spawn(self.relay.bot_key_package(session, payload), "adding the bot to the DAVE group")
        elif op == COMMIT_WELCOME:
            self.relay.bot_commit(payload)
        else:
            await session.close(4001, "Unknown opcode.")
            return False
        return True

    async def _identify(self, session: VoiceSession, d: Any) -> bool:
        if session.identified:
            await session.close(4005, "Already authenticated.")
            return False
        s = self.state
        d = d if isinstance(d, dict) else {}
        expected = {"server_id": str(s.guild.id), "user_id": str(s.bot.id)}
        if any(d.get(k) != v for k, v in expected.items()) or self._tokens.get(d.get("token")) != d.get("session_id"):
            await session.close(4004, "Authentication failed.")
            return False
        if not isinstance(d.get("max_dave_protocol_version"), int) or d["max_dave_protocol_version"] < 1:
            await session.close(4017, "E2EE/DAVE protocol required.")
            return False
        session.identified, session.ssrc = True, self.next_ssrc()
        session.gateway_session_id = d["session_id"]
        self.udp.known.add(session.ssrc)
        await session.send_json(READY, {"ssrc": session.ssrc, "ip": "127.0.0.1", "port": self.udp.port,
                                        "modes": MODES, "experiments": [], "streams": []})
        previous = next((s for s in reversed(self.sessions) if s.ssrc in self.udp.addresses), None)
        if self.answer_discovery_early and previous is not None:
            self.udp.answer_early(session.ssrc, self.udp.addresses[previous.ssrc])
        return True

    async def _select_protocol(self, session: VoiceSession, d: Any) -> bool:
        d = d if isinstance(d, dict) else {}
        data = d.get("data")
        if d.get("protocol") != "udp" or not isinstance(data, dict) or data.get("mode") not in MODES:
            await session.close(4016, "Unknown encryption mode.")
            return False
        discovered = self.udp.addresses.get(session.ssrc)
        if discovered is None:
            self.journal.violation("SELECT_PROTOCOL before UDP IP discovery")
        elif (data.get("address"), data.get("port")) != discovered:
            self.journal.violation(f"SELECT_PROTOCOL address {data} is not the discovered {discovered}")
        session.mode, session.secret_key = data["mode"], os.urandom(32)
        await session.send_json(SESSION_DESCRIPTION, {
            "audio_codec": "opus", "video_codec": "H264", "media_session_id": secrets.token_hex(16),
            "mode": session.mode, "secret_key": list(session.secret_key), "dave_protocol_version": 1})
        await session.send_binary(EXTERNAL_SENDER, self.relay.package())
        others = [uid for uid, cid in self.state.guild.voice.items()
                  if cid == self.state.guild.voice_channel.id and uid != self.state.bot.id]
        if others:
            await session.send_json(CLIENTS_CONNECT, {"user_ids": [str(uid) for uid in others]})
        self.bot_session = session
        session.described.set()
        self.journal.changed()
        return True

    async def _heartbeat(self, session: VoiceSession, d: Any) -> bool:
        if not isinstance(d, dict) or not isinstance(d.get("t"), int) or "seq_ack" not in d:
            self.journal.violation(f"voice heartbeat without t/seq_ack: {d}")
        await session.send_json(HEARTBEAT_ACK, {"t": (d or {}).get("t")})
        return True

    async def _speaking(self, session: VoiceSession, d: Any) -> bool:
        if not isinstance(d, dict) or d.get("ssrc") != session.ssrc or not isinstance(d.get("speaking"), int):
            self.journal.violation(f"voice SPEAKING Discord would reject: {d}")
        return True

    async def _transition_ready(self, session: VoiceSession, d: Any) -> bool:
        tid = (d or {}).get("transition_id")
        if tid not in session._transitions:
            self.journal.violation(f"op 23 for a transition the fake never announced: {d}")
            return True
        session._transitions.discard(tid)
        await session.send_json(EXECUTE_TRANSITION, {"transition_id": tid})
        return True
