"""discord.py wiring: a VoiceClient that hears (our receiver) and speaks (a playback source)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable

import discord
from discord.voice_state import ConnectionFlowState, VoiceConnectionState

from voice.media.receive import Receiver

log = logging.getLogger(__name__)

SpeechSink = Callable[[int, int, bytes], None]
StateObserver = Callable[[ConnectionFlowState], None]


def _is_discovery_reply(datagram: bytes) -> bool:
    return len(datagram) == 74 and datagram[:2] == b"\x00\x02"


class _ListeningConnectionState(VoiceConnectionState):
    """discord.py's voice connection state with three changes for a client that receives audio.

    * Each flow-state change is reported to `observer` (the client listens only while connected).
    * Socket listeners are routed here: discord.py's reader thread gets one callback, `_route`.
      A reader that was receiving before a reconnect (same socket, after a voice-server move) can
      sit in `select()` and take the IP-discovery reply before `discover_ip` has registered for it;
      `_route` keeps such a reply and `add_socket_listener` hands it over, exactly once.
    * One race in discord.py 2.7.1's `disconnect()` is closed (see `disconnect`).
    """

    def __init__(self, voice_client: discord.VoiceClient, *, hook: object, observer: StateObserver) -> None:
        self._observer = observer
        self._leaving = False
        self._route_lock = threading.Lock()
        self._routed: list[Callable[[bytes], object]] = []
        self._routing = False
        self._kept_reply: bytes | None = None
        super().__init__(voice_client, hook=hook)  # type: ignore[arg-type]

    def _set_state(self, state: ConnectionFlowState) -> None:
        VoiceConnectionState.state.fset(self, state)  # type: ignore[attr-defined]
        if state in (ConnectionFlowState.connected, ConnectionFlowState.disconnected):
            # No discovery is pending any more. Not on `websocket_connected`: discord.py sets that
            # after sending IDENTIFY, so an instant READY + reply can be kept before it (a reply the
            # reader kept would be cleared and the handshake would hang). A reply kept across
            # handshakes on the same socket names the same address, so handing it over is safe.
            with self._route_lock:
                self._kept_reply = None
        self._observer(state)

    state = property(VoiceConnectionState.state.fget, _set_state)  # type: ignore[assignment]

    @property
    def socket_listeners(self) -> list[Callable[[bytes], object]]:
        """The listeners datagrams are routed to (a snapshot)."""
        with self._route_lock:
            return list(self._routed)

    def add_socket_listener(self, callback: Callable[[bytes], object]) -> None:
        with self._route_lock:
            self._routed.append(callback)
            kept, self._kept_reply = self._kept_reply, None
        if not self._routing:  # registered lazily: the reader spins while there is no socket
            self._routing = True
            super().add_socket_listener(self._route)
        if kept is not None:
            callback(kept)

    def remove_socket_listener(self, callback: Callable[[bytes], object]) -> None:
        with self._route_lock:
            if callback in self._routed:
                self._routed.remove(callback)

    def _route(self, datagram: bytes) -> None:
        with self._route_lock:
            listeners = list(self._routed)
            if not listeners and _is_discovery_reply(datagram):
                self._kept_reply = datagram
        for callback in listeners:
            callback(datagram)

    async def disconnect(self, *, force: bool = True, cleanup: bool = True, wait: bool = False) -> None:
        # Our own leave closes the voice websocket with 1000. When Discord's VOICE_STATE_UPDATE
        # (channel None) is handled first it consumes `_expecting_disconnect`, so the websocket
        # poller takes that 1000 for a server close and calls disconnect() again; its op 4 clears
        # `_disconnected` after the update set it, and our leave then waits the full `timeout`.
        # While a leave is under way, the poller's echo has nothing left to do.
        if self._inside_runner():
            if self._leaving:
                log.debug("ignoring the voice poller's disconnect: a leave is already in progress")
                return
            await super().disconnect(force=force, cleanup=cleanup, wait=wait)
            return
        self._leaving = True
        try:
            await super().disconnect(force=force, cleanup=cleanup, wait=wait)
        finally:
            self._leaving = False


class ListeningVoiceClient(discord.VoiceClient):
    """A `discord.VoiceClient` that receives per-speaker PCM through DAVE.

    Datagrams are handled by `Receiver` on discord.py's socket reader thread; decoded frames are
    handed to the event loop with `call_soon_threadsafe`, so the loop never waits on the reader.
    Sinks added with `add_sink` run on the loop as `sink(user_id, ssrc, pcm48k_stereo)`.

    The receiver listens on the socket only while the connection is `connected`: discord.py's
    reader thread runs whenever any listener is registered, and `discover_ip` registers its own
    only after sending the request, so a listener present during the handshake lets the reader
    hand the 74-byte discovery reply to us instead (dropped; the join then times out). It is
    unregistered when a reconnect starts and registered again once that handshake is done; a
    reply the reader takes in between is kept for `discover_ip` (`_ListeningConnectionState`).
    """

    def __init__(self, client: discord.Client, channel: discord.abc.Connectable, *,
                 deaf_after_s: float = 5.0, pcm_rate: int = 48_000, pcm_channels: int = 2) -> None:
        self.receiver: Receiver | None = None
        self._listening = False
        super().__init__(client, channel)
        self._sinks: list[SpeechSink] = []
        self.receiver = Receiver(self._connection, self._from_reader_thread, deaf_after_s=deaf_after_s,
                                 pcm_rate=pcm_rate, pcm_channels=pcm_channels)

    @classmethod
    def factory(cls, *, deaf_after_s: float, pcm_rate: int = 48_000,
                pcm_channels: int = 2) -> Callable[[discord.Client, discord.abc.Connectable], ListeningVoiceClient]:
        """What `channel.connect(cls=...)` takes, with settings discord.py's `cls(client, channel)` cannot pass.
        `pcm_rate`/`pcm_channels`: the PCM sinks get (a call asks for the model's 24 kHz mono)."""
        return lambda client, channel: cls(client, channel, deaf_after_s=deaf_after_s, pcm_rate=pcm_rate,
                                           pcm_channels=pcm_channels)

    def create_connection_state(self) -> VoiceConnectionState:
        return _ListeningConnectionState(self, hook=self._voice_ws_hook, observer=self._on_flow_state)

    def _on_flow_state(self, state: ConnectionFlowState) -> None:
        listen = state is ConnectionFlowState.connected and self.receiver is not None
        if listen == self._listening:
            return
        self._listening = listen
        if listen:
            self._connection.add_socket_listener(self.receiver.on_packet)
        else:
            self._connection.remove_socket_listener(self.receiver.on_packet)

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

    async def watch_deafness(self, on_deaf: Callable[[], object] | None = None, *, interval_s: float = 1.0,
                             sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                             on_unheard: Callable[[int], object] | None = None) -> None:
        """Poll the receiver until cancelled: `on_deaf()` when the whole channel goes deaf (then stop:
        a rejoin starts a new watch), `on_unheard(user_id)` once per member whose audio arrives but
        does not decrypt or decode (both are also logged and counted in the receiver's stats)."""
        while True:
            await sleep(interval_s)
            receiver = self.receiver
            if receiver is None:
                continue
            if receiver.check_deaf() and on_deaf is not None:
                result = on_deaf()
                if asyncio.iscoroutine(result):
                    await result
                return
            for user_id in receiver.poll_members():
                if on_unheard is not None:
                    result = on_unheard(user_id)
                    if asyncio.iscoroutine(result):
                        await result
