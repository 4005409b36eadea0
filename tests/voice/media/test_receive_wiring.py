"""Receive wired to the real discord.py pieces: SocketReader over loopback UDP, the VoiceClient
subclass, and frames encrypted by Discord's own libdave."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import discord
import pytest
from discord.voice_state import ConnectionFlowState, SocketReader, VoiceConnectionState

from tests.support.dave_group import DaveGroup
from tests.support.packets import DiscordSender, FakeConnection, dominant_frequency, opus_frames
from voice.media.discord_client import ListeningVoiceClient
from voice.media.receive import Receiver

CHANNEL = 1_200_000_000_000_000_001
BOT, ALICE, LIB = 2_000_000_000_000_000_001, 2_000_000_000_000_000_002, 2_000_000_000_000_000_003


class _SocketState:
    """What discord.py's SocketReader reads from its VoiceConnectionState: `.socket`."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.setblocking(False)


async def test_loopback_udp_through_discord_socket_reader_to_the_event_loop():
    group = DaveGroup(CHANNEL)
    bot, alice = group.join(BOT), group.join(ALICE)
    key = os.urandom(32)
    conn = FakeConnection(list(key), ssrc=1, dave_session=bot, dave_protocol_version=1)
    loop = asyncio.get_running_loop()
    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()
    threads: set[str] = set()

    def on_loop(user_id: int, pcm: bytes) -> None:
        got.append((user_id, pcm))
        if len(got) == 50:
            done.set()

    def on_audio(user_id: int, ssrc: int, pcm: bytes) -> None:  # runs on the reader thread
        threads.add(threading.current_thread().name)
        loop.call_soon_threadsafe(on_loop, user_id, pcm)

    rx = Receiver(conn, on_audio)
    state = _SocketState()
    reader = SocketReader(state, start_paused=False)  # type: ignore[arg-type]
    reader.start()
    reader.register(rx.on_packet)
    sender = DiscordSender(777, list(key), alice)
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.on_ws_message({"op": 5, "d": {"user_id": str(ALICE), "ssrc": 777, "speaking": 1}})
        for frame in opus_frames(523.0, 50):
            out.sendto(sender.packet(frame), state.socket.getsockname())
        await asyncio.wait_for(done.wait(), 10)
    finally:
        reader.stop()
        out.sendto(b"\x00", state.socket.getsockname())  # wakes the reader's select (30 s) to see it must stop
        out.close()
        reader.join(5)
        assert not reader.is_alive()
        state.socket.close()
    assert {u for u, _ in got} == {ALICE}
    assert all(name.startswith("voice-socket-reader") for name in threads)
    freq, _ = dominant_frequency(b"".join(p for _, p in got[5:]))
    assert abs(freq - 523.0) < 5


def test_libdave_encrypted_frames_decode_through_the_receiver():
    pytest.importorskip("dave")
    from tests.support.libdave_member import LibdaveMember

    group = DaveGroup(CHANNEL)
    bot = group.join(BOT)
    group.join(ALICE)
    lib = LibdaveMember.join(group, LIB)
    key = os.urandom(32)
    conn = FakeConnection(list(key), ssrc=1, dave_session=bot, dave_protocol_version=1)
    heard: list[tuple[int, bytes]] = []
    rx = Receiver(conn, lambda u, s, p: heard.append((u, p)))
    sender = DiscordSender(888, list(key), lib)  # discord.py's packet path around libdave's frames
    for frame in opus_frames(440.0, 30):
        rx.on_packet(sender.packet(frame))
    assert rx.stats["identified_by_dave"] == 1 and rx.stats["ok"] == 30, rx.nonzero_stats()
    assert {u for u, _ in heard} == {LIB}
    freq, _ = dominant_frequency(b"".join(p for _, p in heard[5:]))
    assert abs(freq - 440.0) < 5


class _Guild:
    id = 1


class _Channel:
    id = CHANNEL
    guild = _Guild()


def _offline_client() -> discord.Client:
    """A discord.py client that never logs in: enough for constructing a VoiceClient."""
    client = discord.Client(intents=discord.Intents.none())
    client._connection.loop = asyncio.get_running_loop()
    return client


async def test_voice_client_subclass_wires_hook_listener_and_hands_audio_to_the_loop():
    client = _offline_client()
    vc = ListeningVoiceClient(client, _Channel())  # type: ignore[arg-type]
    try:
        assert vc._connection.hook is not None
        # Listening starts only once the handshake is done (IP discovery must reach discord.py).
        assert vc.receiver.on_packet not in vc._connection.socket_listeners
        vc._connection.state = ConnectionFlowState.connected
        assert vc.receiver.on_packet in vc._connection.socket_listeners
        vc._connection.state = ConnectionFlowState.disconnected
        assert vc.receiver.on_packet not in vc._connection.socket_listeners
        received: list[tuple[int, int, int]] = []
        vc.add_sink(lambda u, s, p: received.append((u, s, len(p))))
        await vc._connection.hook(None, {"op": 5, "d": {"user_id": str(ALICE), "ssrc": 5, "speaking": 1}})
        assert vc.receiver.user_for_ssrc(5) == ALICE
        worker = threading.Thread(target=vc._from_reader_thread, args=(ALICE, 5, bytes(3840)))
        worker.start()
        worker.join()
        await asyncio.sleep(0)  # let the loop run the callback scheduled from the other thread
        assert received == [(ALICE, 5, 3840)]
    finally:
        vc._connection._socket_reader.stop()


async def test_voice_client_always_connects_undeafened(monkeypatch):
    """A deafened bot receives nothing, so even an explicit self_deaf=True joins undeafened."""
    client = _offline_client()
    seen: dict = {}

    async def gateway_connect(self, **kwargs):  # the Discord gateway itself cannot exist here
        seen.update(kwargs)

    monkeypatch.setattr(VoiceConnectionState, "connect", gateway_connect)
    vc = ListeningVoiceClient(client, _Channel())  # type: ignore[arg-type]
    try:
        await vc.connect(reconnect=True, timeout=5, self_deaf=True)
        assert seen["self_deaf"] is False
    finally:
        vc._connection._socket_reader.stop()


async def test_the_deaf_window_reaches_the_receiver_and_the_watch_reports_going_deaf():
    client = _offline_client()
    make = ListeningVoiceClient.factory(deaf_after_s=2.5)
    vc = make(client, _Channel())
    try:
        assert isinstance(vc, ListeningVoiceClient) and vc.receiver._deaf.window_s == 2.5
        now = [0.0]
        vc.receiver._clock = lambda: now[0]
        went_deaf: list[float] = []
        polls = asyncio.Event()

        async def tick(_interval: float) -> None:  # one poll per tick; time moves 1 s per poll
            now[0] += 1.0
            vc.receiver._activity += 1  # packets keep arriving ...
            if now[0] >= 6:
                polls.set()
                await asyncio.Event().wait()  # ... and nothing ever decodes; stop polling here
        watch = asyncio.create_task(vc.watch_deafness(lambda: went_deaf.append(now[0]), sleep=tick))
        await asyncio.wait_for(watch, 10)  # going deaf ends this watch: the rejoin starts a new one
        assert not polls.is_set()
        assert went_deaf == [4.0]  # activity since t=1, no PCM: deaf once the 2.5 s window has passed
        assert vc.receiver.stats["deaf_events"] == 1
    finally:
        vc._connection._socket_reader.stop()
