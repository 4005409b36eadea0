"""Hearing health per member: one member whose client is broken is reported while the others are heard.

Genuine crypto throughout: real davey MLS groups, discord.py's packet builder, libopus. A broken
client is one whose DAVE state diverged from the channel's group (`diverged_session`): its frames
are well-formed DAVE frames under keys the bot's group never had. Time is virtual: it enters only
through `poll_members(now)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import sys
import threading
from collections.abc import Callable

import aiohttp
import discord
import pytest

from tests.support.dave_group import DaveGroup, diverged_session
from tests.support.fake_discord import FakeDiscord, point_discord_py_at
from tests.support.packets import ClientPacketBuilder, DiscordSender, FakeConnection, opus_frames
from voice.media.discord_client import ListeningVoiceClient
from voice.media.hearing import MemberHearing
from voice.media.receive import Receiver
from voice.media.rtp import OPUS_SILENCE

CHANNEL = 1_400_000_000_000_000_001
BOT = 4_000_000_000_000_000_001
ALICE = 4_000_000_000_000_000_002
BOB = 4_000_000_000_000_000_003
CAROL = 4_000_000_000_000_000_004
BOT_SSRC, ALICE_SSRC, BOB_SSRC, CAROL_SSRC, STRANGER_SSRC = 1, 1001, 1002, 1003, 1999
WINDOW = 5.0
NO_KEY = "dave_fail:NoValidCryptorFound"


def speaking(user_id: int, ssrc: int) -> dict:
    return {"op": 5, "d": {"user_id": str(user_id), "ssrc": ssrc, "speaking": 1}}


class Call:
    """The bot, Alice and Bob in one genuine DAVE group; Bob's client can break and recover."""

    def __init__(self) -> None:
        self.group = DaveGroup(CHANNEL)
        bot, alice, bob = self.group.join(BOT), self.group.join(ALICE), self.group.join(BOB)
        key = os.urandom(32)
        self.conn = FakeConnection(list(key), ssrc=BOT_SSRC, dave_session=bot, dave_protocol_version=1)
        self.heard: list[int] = []
        self.rx = Receiver(self.conn, lambda user_id, ssrc, pcm: self.heard.append(user_id), deaf_after_s=WINDOW)
        self.alice = DiscordSender(ALICE_SSRC, list(key), alice)
        self.bob = DiscordSender(BOB_SSRC, list(key), bob)
        self.bob_fine, self.bob_broken = bob, diverged_session(CHANNEL, BOB)
        self.tone = opus_frames(440.0, 5)
        self.reports: dict[float, list[int]] = {}

    def break_bob(self, broken: bool = True) -> None:
        self.bob.dave_session = self.bob_broken if broken else self.bob_fine

    def second(self, t: float, *senders: DiscordSender) -> None:
        """One virtual second: five frames from each sender, then the watch loop's poll at `t`."""
        for frame in self.tone:
            for sender in senders:
                self.rx.on_packet(sender.packet(frame))
        found = self.rx.poll_members(now=t)
        if found:
            self.reports[t] = found


@pytest.fixture
def call() -> Call:
    c = Call()
    c.rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    c.rx.on_ws_message(speaking(BOB, BOB_SSRC))
    return c


# -- through the receiver, genuine crypto ---------------------------------------------------------


def test_a_member_whose_frames_never_decrypt_is_reported_once_and_the_others_never(call):
    call.break_bob()
    for t in range(12):
        call.second(float(t), call.alice, call.bob)

    assert call.reports == {5.0: [BOB]}  # failures first seen at t=0, still arriving at t=5
    health = call.rx.member_health()
    assert health[BOB] == {"state": "unheard", "ok": 0, "failed": 60, "reason": NO_KEY}
    assert health[ALICE] == {"state": "ok", "ok": 60, "failed": 0, "reason": None}
    assert call.heard.count(ALICE) == 60 and BOB not in call.heard
    assert call.rx.stats[NO_KEY] == 60 and call.rx.stats["unheard_events"] == 1
    assert call.rx.check_deaf(now=12.0) is False  # the channel as a whole is heard: no rejoin


def test_a_member_heard_again_ends_the_episode_and_a_later_breakage_is_reported_again(call):
    call.break_bob()
    for t in range(7):
        call.second(float(t), call.alice, call.bob)
    call.break_bob(False)
    call.second(7.0, call.bob)
    assert call.rx.member_health()[BOB]["state"] == "ok"
    call.break_bob()
    for t in range(8, 20):
        call.second(float(t), call.alice, call.bob)

    assert call.reports == {5.0: [BOB], 13.0: [BOB]}
    assert call.heard.count(BOB) == 5
    assert call.rx.member_health()[BOB]["ok"] == 5


def test_a_failing_member_who_leaves_is_forgotten_and_never_reported(call):
    call.break_bob()
    for t in range(3):
        call.second(float(t), call.alice, call.bob)
    assert call.rx.member_health()[BOB]["state"] == "failing"
    call.group.leave(BOB)
    call.rx.on_ws_message({"op": 13, "d": {"user_id": str(BOB)}})
    assert BOB not in call.rx.member_health()
    for t in range(3, 12):
        call.second(float(t), call.alice, call.bob)  # a straggler stream on the old SSRC: nobody's now

    assert call.reports == {}
    assert set(call.rx.member_health()) == {ALICE}


def test_failures_of_an_ssrc_with_no_known_user_are_never_attributed(call):
    stranger = DiscordSender(STRANGER_SSRC, call.conn.secret_key, diverged_session(CHANNEL, CAROL))
    for t in range(12):
        call.second(float(t), call.alice, stranger)  # Alice announced herself and speaks alongside

    assert call.reports == {}
    assert set(call.rx.member_health()) == {ALICE}
    assert call.rx.member_health()[ALICE]["failed"] == 0  # never pinned on the last speaker
    assert call.rx.stats["unmapped_buffered"] == 60 and call.rx.stats["unmapped_dropped"] == 10
    assert call.rx.stats["identified_by_dave"] == 0 and not any(k.startswith("dave_fail:") for k in call.rx.stats)


def test_failures_around_a_join_are_counted_but_a_member_heard_within_the_window_is_not_reported(call):
    """Carol's client speaks before the bot's group has her (NoDecryptorForUser), as around a join."""
    early = DiscordSender(CAROL_SSRC, call.conn.secret_key, diverged_session(CHANNEL, CAROL))
    call.rx.on_ws_message(speaking(CAROL, CAROL_SSRC))
    for t in range(3):
        call.second(float(t), call.alice, early)
    assert call.rx.member_health()[CAROL]["reason"] == "dave_fail:NoDecryptorForUser"
    carol = DiscordSender(CAROL_SSRC, call.conn.secret_key, call.group.join(CAROL), sequence=early.sequence,
                          timestamp=early.timestamp)
    for t in range(3, 12):
        call.second(float(t), call.alice, carol)

    assert call.reports == {}
    assert call.rx.member_health()[CAROL] == {"state": "ok", "ok": 45, "failed": 15,
                                              "reason": "dave_fail:NoDecryptorForUser"}


def test_a_brief_burst_of_failures_then_silence_is_never_reported(call):
    """Only a streak of failures spanning the window counts, not time passing after one burst."""
    call.break_bob()
    call.second(0.0, call.alice, call.bob)  # e.g. the last frames of a sentence, across an epoch change
    for t in range(1, 30):
        call.second(float(t), call.alice)  # Bob says nothing more

    assert call.reports == {}
    assert call.rx.member_health()[BOB]["state"] == "failing"


def test_failures_with_pauses_between_utterances_still_add_up(call):
    call.break_bob()
    for t in range(12):
        call.second(float(t), *((call.alice, call.bob) if t % 3 == 0 else (call.alice,)))

    assert call.reports == {6.0: [BOB]}  # Bob spoke at t=0, 3 and 6: six seconds unheard


def test_the_unencrypted_silence_frame_after_each_utterance_does_not_count_as_hearing_them(call):
    call.break_bob()
    for t in range(8):
        call.second(float(t), call.alice, call.bob)
        call.rx.on_packet(call.bob.packet(OPUS_SILENCE))  # clients end every utterance with it

    assert call.reports == {5.0: [BOB]}
    assert call.rx.member_health()[BOB]["ok"] == 0 and call.heard.count(BOB) == 8  # decoded, not "heard"


def test_undecodable_opus_makes_a_member_unheard_without_dave():
    key = os.urandom(32)
    rx = Receiver(FakeConnection(list(key), ssrc=BOT_SSRC), lambda *_: None, deaf_after_s=WINDOW)
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    rx.on_ws_message(speaking(BOB, BOB_SSRC))
    alice, bob = DiscordSender(ALICE_SSRC, list(key)), ClientPacketBuilder(BOB_SSRC, key)
    reports = {}
    for t, frame in enumerate(opus_frames(440.0, 8)):
        rx.on_packet(alice.packet(frame))
        rx.on_packet(bob.packet(b"\xff\xff"))  # a code-3 TOC with an impossible frame count
        reports[t] = rx.poll_members(now=float(t))

    assert {t: r for t, r in reports.items() if r} == {5: [BOB]}
    assert rx.member_health()[BOB] == {"state": "unheard", "ok": 0, "failed": 8, "reason": "opus_fail"}


def test_while_the_whole_channel_is_deaf_member_reports_wait_for_the_channel_wide_one(call):
    call.break_bob()
    call.alice.dave_session = diverged_session(CHANNEL, ALICE)
    deaf = {}
    for t in range(8):
        for frame in call.tone:
            call.rx.on_packet(call.alice.packet(frame))
            call.rx.on_packet(call.bob.packet(frame))
        if call.rx.check_deaf(now=float(t)):
            deaf[t] = True
        assert call.rx.poll_members(now=float(t)) == []
    assert deaf == {5: True}
    assert {u: h["state"] for u, h in call.rx.member_health().items()} == {ALICE: "unheard", BOB: "unheard"}

    call.alice.dave_session = call.group.members[ALICE]  # Alice's client recovers: the channel hears again
    call.second(8.0, call.alice, call.bob)
    assert call.rx.check_deaf(now=9.0) is False
    call.second(9.0, call.alice, call.bob)
    assert call.reports == {9.0: [BOB]}


def test_poll_members_and_member_health_are_safe_while_the_reader_thread_delivers(call):
    """Members appear on the reader thread while the loop polls; switching threads as often as the
    interpreter can makes an unlocked iteration fail ("dictionary changed size during iteration")."""
    key = bytes(call.conn.secret_key)
    newcomers = range(CAROL, CAROL + 1000)
    for i, uid in enumerate(newcomers):
        call.rx.on_ws_message(speaking(uid, CAROL_SSRC + i))
    packets = [ClientPacketBuilder(CAROL_SSRC + i, key).packet(call.tone[0]) for i in range(len(newcomers))]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    errors: list[BaseException] = []
    try:
        reader = threading.Thread(target=lambda: [call.rx.on_packet(p) for p in packets])
        reader.start()
        t = 0.0
        while reader.is_alive():
            try:
                call.rx.poll_members(now=t)
                call.rx.member_health()
            except RuntimeError as exc:
                errors.append(exc)
                break
            t += 0.001
        reader.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == [] and call.rx.stats["error"] == 0
    health = call.rx.member_health()
    assert len(health) == 1000 and {h["reason"] for h in health.values()} == {
        "dave_fail:NoDecryptorForUser"}  # users the bot's group does not have


# -- the ledger alone -----------------------------------------------------------------------------


def test_ledger_holds_a_report_until_released_and_never_repeats_it():
    ledger = MemberHearing(2.0)
    for t in range(4):
        ledger.failed(7, "opus_fail")
        assert ledger.poll(float(t), hold=True) == []
    assert ledger.health()[7]["state"] == "unheard"
    assert ledger.poll(4.0) == [7]
    ledger.failed(7, "opus_fail")
    assert ledger.poll(5.0) == [] and ledger.poll(6.0) == []


def test_ledger_forgets_a_member_and_starts_over_when_they_come_back():
    ledger = MemberHearing(2.0)
    for t in range(3):
        ledger.failed(7, NO_KEY)
        ledger.poll(float(t))
    ledger.forget(7)
    assert ledger.health() == {}
    ledger.failed(7, NO_KEY)
    assert ledger.poll(3.0) == [] and ledger.health()[7] == {"state": "failing", "ok": 0, "failed": 1,
                                                              "reason": NO_KEY}


# -- through the fake Discord: real discord.py, real voice gateway, DAVE relay and UDP -------------


class WatchedVoiceClient(ListeningVoiceClient):
    """Our voice client, plus what a test needs to wait on instead of sleeping: the voice-websocket
    ops the receiver has seen (the hook runs on the loop, after discord.py's own handling) and the
    datagrams it has handled (a listener routed after the receiver's, on the same reader thread)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.ops: list[int] = []
        self.datagrams = 0
        self._changed = asyncio.Condition()

    async def _voice_ws_hook(self, ws: object, msg: dict) -> None:
        await super()._voice_ws_hook(ws, msg)
        self.ops.append(msg.get("op"))
        await self._notify()

    def count_datagrams(self) -> None:
        loop = asyncio.get_running_loop()
        self._connection.add_socket_listener(lambda _d: loop.call_soon_threadsafe(self._datagram))

    def _datagram(self) -> None:
        self.datagrams += 1
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 15.0) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)


async def test_through_the_fake_discord_a_member_whose_client_is_broken_is_reported(tmp_path):
    async with FakeDiscord(voice=True, workdir=tmp_path) as fake:
        alice, bob = fake.add_user("alice"), fake.add_user("bob")
        await fake.join_voice(alice)
        (await fake.join_voice(bob)).broken = True  # Bob's client has lost the group's keys
        trust = ssl.create_default_context(cafile=str(fake.cert_path))  # TLS verified, against the fake's cert
        client = discord.Client(intents=discord.Intents.default(), connector=aiohttp.TCPConnector(ssl=trust))
        available = asyncio.Event()

        @client.event
        async def on_guild_available(guild: discord.Guild) -> None:
            available.set()

        vc: WatchedVoiceClient | None = None
        with point_discord_py_at(fake):
            runner = asyncio.create_task(client.start(fake.token))
            try:
                await asyncio.wait_for(available.wait(), 15)
                channel = client.get_channel(fake.voice_channel.id)
                vc = await channel.connect(cls=WatchedVoiceClient.factory(deaf_after_s=WINDOW), self_deaf=False,
                                           timeout=15)
                await vc.wait_until(lambda: 22 in vc.ops)  # welcomed into the group, transition executed
                vc.count_datagrams()
                await fake.speak(alice, [])  # op 5 SPEAKING only
                await fake.speak(bob, [])
                await vc.wait_until(lambda: vc.ops.count(5) >= 2)
                reports = {}
                for t in range(8):
                    await fake.speak(alice, opus_frames(440.0, 5), announce=False)
                    await fake.speak(bob, opus_frames(330.0, 5), announce=False)
                    await vc.wait_until(lambda t=t: vc.datagrams == 10 * (t + 1))
                    reports[t] = vc.receiver.poll_members(now=float(t))
                health = vc.receiver.member_health()
                stats = vc.receiver.nonzero_stats()
            finally:
                if vc is not None:
                    await vc.disconnect(force=True)
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
                await client.close()
        fake.assert_clean()

    assert {t: r for t, r in reports.items() if r} == {5: [bob.id]}, (health, stats)
    assert health[bob.id] == {"state": "unheard", "ok": 0, "failed": 40, "reason": NO_KEY}
    assert health[alice.id] == {"state": "ok", "ok": 40, "failed": 0, "reason": None}
