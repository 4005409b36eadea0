"""discord.py wiring: a VoiceClient that hears (our receiver) and speaks (a playback source)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import discord
from discord.voice_state import VoiceConnectionState

from .receive import Receiver

log = logging.getLogger(__name__)

SpeechSink = Callable[[int, int, bytes], None]


class ListeningVoiceClient(discord.VoiceClient):
    """A `discord.VoiceClient` that receives per-speaker PCM through DAVE.

    Datagrams are handled by `Receiver` on discord.py's socket reader thread; decoded frames are
    handed to the event loop with `call_soon_threadsafe`, so the loop never waits on the reader.
    Sinks added with `add_sink` run on the loop as `sink(user_id, ssrc, pcm48k_stereo)`.
    """

    def __init__(self, client: discord.Client, channel: discord.abc.Connectable) -> None:
        self.receiver: Receiver | None = None
        super().__init__(client, channel)
        self._sinks: list[SpeechSink] = []
        self.receiver = Receiver(self._connection, self._from_reader_thread)
        self._connection.add_socket_listener(self.receiver.on_packet)

    def create_connection_state(self) -> VoiceConnectionState:
        return VoiceConnectionState(self, hook=self._voice_ws_hook)

    async def _voice_ws_hook(self, _ws: object, msg: dict) -> None:
        if self.receiver is not None:
            self.receiver.on_ws_message(msg)

    async def connect(self, *, reconnect: bool, timeout: float, self_deaf: bool = False,
                      self_mute: bool = False) -> None:
        if self_deaf:
            log.info("ignoring self_deaf=True: a deafened bot receives no audio")
        await super().connect(reconnect=reconnect, timeout=timeout, self_deaf=False, self_mute=self_mute)

    def add_sink(self, sink: SpeechSink) -> None:
        self._sinks.append(sink)

    def remove_sink(self, sink: SpeechSink) -> None:
        if sink in self._sinks:
            self._sinks.remove(sink)

    def _from_reader_thread(self, user_id: int, ssrc: int, pcm: bytes) -> None:
        try:
            self.loop.call_soon_threadsafe(self._dispatch, user_id, ssrc, pcm)
        except RuntimeError:  # loop closed while the reader was still delivering
            pass

    def _dispatch(self, user_id: int, ssrc: int, pcm: bytes) -> None:
        for sink in list(self._sinks):
            try:
                sink(user_id, ssrc, pcm)
            except Exception:
                log.exception("speech sink %r failed", sink)

    async def watch_deafness(self, interval_s: float = 1.0) -> None:
        """Poll the receiver's deaf detector until cancelled (logged and counted in stats)."""
        while True:
            await asyncio.sleep(interval_s)
            if self.receiver is not None:
                self.receiver.check_deaf()
