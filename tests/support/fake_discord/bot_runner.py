"""A voice test bot: real discord.py + our `ListeningVoiceClient`, pointed at a fake Discord.

    python -m tests.support.fake_discord.bot_runner

Runs in a subprocess because discord.py verifies the fake voice gateway's TLS certificate against
the default trust store, which honours `SSL_CERT_FILE` only if set before aiohttp is imported.
Environment: FAKE_DISCORD_API, FAKE_DISCORD_GATEWAY, FAKE_DISCORD_TOKEN, SSL_CERT_FILE,
FAKE_DISCORD_PCM_DIR (PCM heard per user is appended to `<user_id>.pcm` there), FAKE_DISCORD_LOG
(optional discord.py debug log file).

Commands, one JSON object per stdin line: {"cmd": "join", "channel_id": N}, {"cmd": "leave"},
{"cmd": "play", "freq": Hz, "frames": N}, {"cmd": "stats"}. SIGINT ends it as `Client.run` does.
Events, one JSON object per stdout line: guild_available, joined (with the socket-listener
registrations seen while connecting), join_failed, dave (can_encrypt flips), pcm (frames heard
per user, cumulative), left, played, stats, error, and voice_log (each record of discord.py's
`discord.voice_state` logger: how a test sees what discord.py made of a voice close such as 4014).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import discord
from discord.voice_state import VoiceConnectionState

from tests.support.fake_discord.pointing import point_discord_py
from voice.media.discord_client import ListeningVoiceClient


def emit(event: str, **data: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **data}) + "\n")
    sys.stdout.flush()


def _name(callback: Any) -> str:
    return getattr(callback, "__qualname__", repr(callback))


class VoiceLog(logging.Handler):
    """Forwards discord.py's voice connection log as `voice_log` events."""

    def emit(self, record: logging.LogRecord) -> None:
        emit("voice_log", level=record.levelname, message=record.getMessage())


class ProbedVoiceClient(ListeningVoiceClient):
    """Records socket-listener registrations (in memory: no I/O that could change thread timing)
    and reports DAVE readiness flips seen in the voice websocket hook."""

    def create_connection_state(self) -> VoiceConnectionState:
        state = super().create_connection_state()
        self.listener_log: list[dict] = []
        add, remove = state.add_socket_listener, state.remove_socket_listener

        def listeners() -> list:  # our routed listeners, or (before the fix) the reader's own list
            if hasattr(state, "socket_listeners"):
                return state.socket_listeners
            return list(state._socket_reader._callbacks)

        def probed_add(callback: Any) -> None:
            others = [_name(cb) for cb in listeners()]
            add(callback)
            self.listener_log.append({"action": "add", "name": _name(callback), "others": others})

        def probed_remove(callback: Any) -> None:
            remove(callback)
            self.listener_log.append({"action": "remove", "name": _name(callback)})

        state.add_socket_listener, state.remove_socket_listener = probed_add, probed_remove
        self._can_encrypt = False
        return state

    def take_listener_log(self) -> list[dict]:
        log, self.listener_log = self.listener_log, []
        return log

    async def _voice_ws_hook(self, ws: object, msg: dict) -> None:
        await super()._voice_ws_hook(ws, msg)
        now = self._connection.can_encrypt
        if now != self._can_encrypt:
            self._can_encrypt = now
            session = self._connection.dave_session
            emit("dave", can_encrypt=now, epoch=session.epoch if session else None, op=msg["op"],
                 listeners=self.take_listener_log())


class Tone(discord.AudioSource):
    """`frames` 20 ms frames of a 48 kHz stereo sine, then end."""

    def __init__(self, freq: float, frames: int) -> None:
        self.freq, self.frames, self.sent = freq, frames, 0
        self._lock = threading.Lock()

    def read(self) -> bytes:
        with self._lock:
            if self.sent >= self.frames:
                return b""
            start = self.sent * 960
            self.sent += 1
        samples = (int(0.3 * 32767 * math.sin(2 * math.pi * self.freq * (start + i) / 48_000)) for i in range(960))
        return b"".join(s.to_bytes(2, "little", signed=True) * 2 for s in samples)


class TestBot(discord.Client):
    def __init__(self, pcm_dir: Path) -> None:
        super().__init__(intents=discord.Intents.default())
        self.pcm_dir = pcm_dir
        self.heard: dict[int, int] = {}
        self.vc: ProbedVoiceClient | None = None
        self._commands: asyncio.Task | None = None

    async def setup_hook(self) -> None:
        self._commands = asyncio.create_task(self._read_commands())
        import signal
        def dump():
            for t in asyncio.all_tasks():
                t.print_stack(file=sys.stderr)
            sys.stderr.flush()
        self.loop.add_signal_handler(signal.SIGUSR1, dump)

    async def on_guild_available(self, guild: discord.Guild) -> None:
        emit("guild_available", guild_id=guild.id)

    def _sink(self, user_id: int, ssrc: int, pcm: bytes) -> None:
        with open(self.pcm_dir / f"{user_id}.pcm", "ab") as out:
            out.write(pcm)
        self.heard[user_id] = self.heard.get(user_id, 0) + 1
        emit("pcm", user_id=user_id, ssrc=ssrc, frames=self.heard[user_id])

    async def _read_commands(self) -> None:
        reader = asyncio.StreamReader()
        await self.loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            command = json.loads(line)
            try:
                await getattr(self, f"cmd_{command.pop('cmd')}")(**command)
            except Exception as exc:  # report and keep serving: the test decides what it means
                emit("error", error=repr(exc))

    async def cmd_join(self, channel_id: int, timeout: float = 20.0) -> None:
        channel = self.get_channel(channel_id)
        try:
            vc = await channel.connect(cls=ProbedVoiceClient, self_deaf=False, timeout=timeout)
        except Exception as exc:
            emit("join_failed", error=repr(exc))
            return
        self.vc = vc
        vc.add_sink(self._sink)
        emit("joined", ssrc=vc.ssrc, mode=vc.mode, listeners=vc.take_listener_log())

    async def cmd_leave(self) -> None:
        await self.vc.disconnect()
        self.vc = None
        emit("left")

    async def cmd_play(self, freq: float, frames: int) -> None:
        done = asyncio.Event()
        self.vc.play(Tone(freq, frames), after=lambda _err: self.loop.call_soon_threadsafe(done.set))
        await done.wait()
        emit("played")

    async def cmd_stats(self) -> None:
        emit("stats", receiver=self.vc.receiver.nonzero_stats() if self.vc else {},
             listeners=self.vc.take_listener_log() if self.vc else [])


def main() -> None:
    # Ctrl-C is how the rig stops this bot (`BotProcess.stop`). A parent that ignores SIGINT — any
    # background job of a non-interactive shell (`cmd &`) — passes that on, and Python then keeps it
    # ignored: the bot would never hear Ctrl-C and be killed after the stop timeout (exit -9).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    env = os.environ
    log_file = env.get("FAKE_DISCORD_LOG")
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    logging.getLogger("discord.voice_state").addHandler(VoiceLog())
    bot = TestBot(Path(env["FAKE_DISCORD_PCM_DIR"]))
    with point_discord_py(env["FAKE_DISCORD_API"], env["FAKE_DISCORD_GATEWAY"]):
        bot.run(env["FAKE_DISCORD_TOKEN"], log_handler=handler,
                log_level=logging.DEBUG if log_file else logging.WARNING, root_logger=True)


if __name__ == "__main__":
    main()
