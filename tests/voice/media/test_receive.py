"""The receive core with genuine crypto: discord.py's packet builder, real davey groups, libopus."""

from __future__ import annotations

import os
import random

import davey
import numpy as np
import pytest

from tests.support.dave_group import DaveGroup
from tests.support.packets import (
    AES_GCM,
    ClientPacketBuilder,
    DiscordSender,
    FakeConnection,
    dominant_frequency,
    opus_frames,
)
from voice.media.receive import Receiver
from voice.media.rtp import OPUS_SILENCE

CHANNEL = 1_100_000_000_000_000_001
BOT = 1_000_000_000_000_000_001
ALICE = 1_000_000_000_000_000_002
BOB = 1_000_000_000_000_000_003
CAROL = 1_000_000_000_000_000_004
BOT_SSRC, ALICE_SSRC, BOB_SSRC, CAROL_SSRC = 1, 1001, 1002, 1003


class Heard:
    """Collects on_audio calls."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, int, bytes]] = []

    def __call__(self, user_id: int, ssrc: int, pcm: bytes) -> None:
        assert len(pcm) == 3840
        self.frames.append((user_id, ssrc, pcm))

    def pcm_of(self, user_id: int) -> bytes:
        return b"".join(p for u, _, p in self.frames if u == user_id)

    def users(self) -> list[int]:
        return [u for u, _, _ in self.frames]


def speaking(user_id: int, ssrc: int) -> dict:
    return {"op": 5, "d": {"user_id": str(user_id), "ssrc": ssrc, "speaking": 1}}


@pytest.fixture(scope="module")
def tone() -> list[bytes]:
    return opus_frames(440.0, 50, amplitude=0.3)


@pytest.fixture
def plain_call():
    """A call without DAVE (protocol 0): transport encryption only."""
    key = os.urandom(32)
    conn = FakeConnection(secret_key=list(key), ssrc=BOT_SSRC)
    heard = Heard()
    return conn, Receiver(conn, heard), heard, key


@pytest.fixture
def dave_call():
    """Bot, Alice and Bob in one genuine DAVE group; the bot's session sits on the connection."""
    group = DaveGroup(CHANNEL)
    bot = group.join(BOT)
    alice = group.join(ALICE)
    bob = group.join(BOB)
    key = os.urandom(32)
    conn = FakeConnection(secret_key=list(key), ssrc=BOT_SSRC, dave_session=bot, dave_protocol_version=1)
    heard = Heard()
    rx = Receiver(conn, heard)
    senders = {
        ALICE: DiscordSender(ALICE_SSRC, list(key), alice),
        BOB: DiscordSender(BOB_SSRC, list(key), bob),
    }
    return group, conn, rx, heard, senders


def assert_tone(pcm: bytes, freq: float = 440.0) -> None:
    got, rms = dominant_frequency(pcm[3840 * 5 :])  # skip the decoder's warm-up
    assert abs(got - freq) < 5, got
    assert 0.15 < rms < 0.3, rms  # a 0.3-amplitude sine has RMS 0.21


# -- transport only -------------------------------------------------------------------------------


def test_discord_py_packets_decode_to_the_same_tone(plain_call, tone):
    conn, rx, heard, key = plain_call
    sender = DiscordSender(ALICE_SSRC, list(key))
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    for frame in tone:
        rx.on_packet(sender.packet(frame))
    assert rx.stats["ok"] == 50 and heard.users() == [ALICE] * 50
    assert_tone(heard.pcm_of(ALICE))


@pytest.mark.parametrize("mode", ["aead_xchacha20_poly1305_rtpsize", AES_GCM])
@pytest.mark.parametrize(
    "shape",
    [dict(), dict(ext_words=1), dict(ext_words=3), dict(padding=4), dict(padding=255),
     dict(csrcs=(7, 8)), dict(csrcs=(9,), ext_words=2, padding=17)],
    ids=["plain", "ext1", "ext3", "pad4", "pad255", "csrc2", "all"],
)
def test_client_shaped_packets_decode(mode, shape, tone):
    key = os.urandom(32)
    conn = FakeConnection(secret_key=list(key), ssrc=BOT_SSRC, mode=mode)
    heard = Heard()
    rx = Receiver(conn, heard)
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    builder = ClientPacketBuilder(ALICE_SSRC, key, mode=mode)
    for frame in tone:
        rx.on_packet(builder.packet(frame, **shape))
    assert rx.stats["ok"] == 50, rx.nonzero_stats()
    assert_tone(heard.pcm_of(ALICE))


def test_rtcp_non_opus_own_and_video_ssrcs_are_skipped_and_counted(plain_call, tone):
    conn, rx, heard, key = plain_call
    builder = ClientPacketBuilder(ALICE_SSRC, key)
    rx.on_ws_message({"op": 12, "d": {"user_id": str(ALICE), "audio_ssrc": ALICE_SSRC, "video_ssrc": 2001,
                                      "rtx_ssrc": 2002, "streams": [{"ssrc": 2003, "rtx_ssrc": 2004}]}})
    rx.on_packet(bytes([0x80, 200]) + bytes(26))  # RTCP sender report
    rx.on_packet(builder.packet(tone[0], payload_type=0x65))  # not Opus
    rx.on_packet(ClientPacketBuilder(BOT_SSRC, key).packet(tone[0]))  # our own echo
    for video in (2001, 2002, 2003, 2004):
        rx.on_packet(ClientPacketBuilder(video, key).packet(tone[0]))
    rx.on_packet(builder.packet(tone[1]))
    s = rx.stats
    assert (s["rtcp"], s["not_opus"], s["own"], s["video"], s["ok"]) == (1, 1, 1, 4, 1)
    assert heard.users() == [ALICE]


def test_garbage_and_truncated_datagrams_are_counted_never_raised(plain_call, tone):
    conn, rx, heard, key = plain_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    good = ClientPacketBuilder(ALICE_SSRC, key).packet(tone[0], ext_words=2)
    rng = random.Random(20261201)
    noise = bytes(rng.getrandbits(8) for _ in range(200))
    noise = bytes([0x80, 0x78]) + noise[2:]  # RTP v2, Opus: garbage that reaches the cipher
    junk = [b"", b"\x80", bytes(11), b"\x40" + bytes(30), noise, good[:13], good[:20], good[:-1],
            good[:12] + b"\xbe\xde\xff\xff", bytes([0x9F]) + good[1:]]
    flipped = bytearray(good)
    flipped[30] ^= 1
    junk.append(bytes(flipped))
    rtcp = bytes([0x81, 200]) + bytes(26)  # a sender report: skipped on purpose, counted as RTCP
    for datagram in [*junk, rtcp]:
        rx.on_packet(datagram)
    assert heard.frames == [] and rx.stats["error"] == 0
    assert rx.stats["malformed"] + rx.stats["transport_fail"] + rx.stats["not_opus"] == len(junk)
    assert rx.stats["rtcp"] == 1


def test_corrupt_padding_and_extension_lengths_are_dropped(plain_call, tone):
    conn, rx, heard, key = plain_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    builder = ClientPacketBuilder(ALICE_SSRC, key)
    # P bit set but the (authenticated) pad count is zero, then larger than the payload.
    zero_pad = builder.packet(tone[0] + b"\x00", padding=0)
    zero_pad = bytes([zero_pad[0] | 0x20]) + zero_pad[1:]  # header flip breaks the AAD: transport_fail
    rx.on_packet(zero_pad)
    b0 = 0x80 | 0x20
    import struct

    import nacl.bindings
    header = struct.pack(">BBHII", b0, 0x78, 500, 0, ALICE_SSRC)
    for body in (b"\x01\x02\x00", b"\x01\x02\x09"):
        sealed = nacl.bindings.crypto_aead_xchacha20poly1305_ietf_encrypt(body, header, bytes(24), key)
        rx.on_packet(header + sealed + bytes(4))
        header = struct.pack(">BBHII", b0, 0x78, 501, 0, ALICE_SSRC)
    assert rx.stats["bad_padding"] == 2 and rx.stats["transport_fail"] == 1 and heard.frames == []


def test_replayed_datagrams_are_dropped(plain_call, tone):
    conn, rx, heard, key = plain_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    sender = DiscordSender(ALICE_SSRC, list(key))
    packets = [sender.packet(f) for f in tone[:10]]
    for p in packets:
        rx.on_packet(p)
    for p in packets[3:7]:
        rx.on_packet(p)
    assert rx.stats["ok"] == 10 and rx.stats["duplicate"] == 4


def test_reordered_packets_within_the_window_are_kept(plain_call, tone):
    conn, rx, heard, key = plain_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    sender = DiscordSender(ALICE_SSRC, list(key))
    packets = [sender.packet(f) for f in tone[:6]]
    for p in (packets[0], packets[2], packets[1], packets[4], packets[3], packets[5]):
        rx.on_packet(p)
    assert rx.stats["ok"] == 6 and rx.stats["duplicate"] == 0


def test_wrong_key_and_key_rotation(plain_call, tone):
    conn, rx, heard, key = plain_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    rx.on_packet(ClientPacketBuilder(ALICE_SSRC, os.urandom(32)).packet(tone[0]))
    assert rx.stats["transport_fail"] == 1
    new_key = os.urandom(32)
    conn.secret_key = list(new_key)  # a reconnect brings a new session description
    rx.on_packet(ClientPacketBuilder(ALICE_SSRC, new_key, sequence=9).packet(tone[1]))
    assert rx.stats["ok"] == 1
    conn.secret_key = None
    rx.on_packet(ClientPacketBuilder(ALICE_SSRC, new_key, sequence=10).packet(tone[2]))
    assert rx.stats["no_key"] == 1


def test_unmapped_speaker_is_buffered_then_flushed_on_op5(plain_call, tone):
    conn, rx, heard, key = plain_call
    sender = DiscordSender(ALICE_SSRC, list(key))
    for frame in tone[:20]:
        rx.on_packet(sender.packet(frame))
    assert heard.frames == [] and rx.stats["unmapped_buffered"] == 20
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    assert heard.users() == [ALICE] * 20 and rx.stats["unmapped_flushed"] == 20


def test_unmapped_buffer_holds_about_one_second(plain_call, tone):
    conn, rx, heard, key = plain_call
    sender = DiscordSender(ALICE_SSRC, list(key))
    for frame in tone + tone[:20]:
        rx.on_packet(sender.packet(frame))
    rx.on_ws_message({"op": 12, "d": {"user_id": str(ALICE), "audio_ssrc": ALICE_SSRC, "video_ssrc": 0}})
    assert len(heard.frames) == 50 and rx.stats["unmapped_dropped"] == 20


def test_op13_forgets_the_speaker(plain_call, tone):
    conn, rx, heard, key = plain_call
    sender = DiscordSender(ALICE_SSRC, list(key))
    rx.on_ws_message({"op": 11, "d": {"user_ids": [str(ALICE)]}})
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    rx.on_packet(sender.packet(tone[0]))
    rx.on_ws_message({"op": 13, "d": {"user_id": str(ALICE)}})
    assert rx.user_for_ssrc(ALICE_SSRC) is None and ALICE not in rx.roster
    rx.on_packet(sender.packet(tone[1]))
    assert heard.users() == [ALICE] and rx.stats["unmapped_buffered"] == 1


def test_ssrc_reassigned_to_another_user_resets_attribution(plain_call, tone):
    conn, rx, heard, key = plain_call
    sender = DiscordSender(ALICE_SSRC, list(key))
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    rx.on_packet(sender.packet(tone[0]))
    rx.on_ws_message(speaking(BOB, ALICE_SSRC))
    rx.on_packet(sender.packet(tone[1]))
    assert heard.users() == [ALICE, BOB]


def test_malformed_ws_messages_are_counted(plain_call):
    conn, rx, heard, key = plain_call
    for msg in ({"op": 5, "d": {"ssrc": "x"}}, {"op": 13, "d": {}}, {"op": 5, "d": None}, {"op": "?"}):
        rx.on_ws_message(msg)
    assert rx.stats["ws_malformed"] == 2


def test_silence_frames_pass_and_decode_to_silence(plain_call):
    conn, rx, heard, key = plain_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    sender = DiscordSender(ALICE_SSRC, list(key))
    for _ in range(3):
        rx.on_packet(sender.packet(OPUS_SILENCE))
    assert len(heard.frames) == 3 and max(heard.pcm_of(ALICE)) == 0


def test_undecodable_opus_is_counted(plain_call):
    conn, rx, heard, key = plain_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    # TOC byte announcing a 120 ms-at-48k code-3 packet with an impossible frame count
    rx.on_packet(ClientPacketBuilder(ALICE_SSRC, key).packet(b"\xff\xff"))
    assert rx.stats["opus_fail"] == 1 and heard.frames == []


# -- DAVE -----------------------------------------------------------------------------------------


def test_dave_frames_from_discord_py_decrypt_per_sender(dave_call, tone):
    group, conn, rx, heard, senders = dave_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    rx.on_ws_message(speaking(BOB, BOB_SSRC))
    bob_tone = opus_frames(660.0, 50)
    for a, b in zip(tone, bob_tone, strict=True):
        rx.on_packet(senders[ALICE].packet(a))
        rx.on_packet(senders[BOB].packet(b))
    assert rx.stats["ok"] == 100, rx.nonzero_stats()
    assert_tone(heard.pcm_of(ALICE), 440.0)
    assert_tone(heard.pcm_of(BOB), 660.0)


@pytest.mark.parametrize("shape", [dict(ext_words=1), dict(padding=9), dict(csrcs=(3,), ext_words=2, padding=31)])
def test_dave_with_extension_and_padding(dave_call, tone, shape):
    group, conn, rx, heard, senders = dave_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    alice = group.members[ALICE]
    builder = ClientPacketBuilder(ALICE_SSRC, bytes(conn.secret_key))
    for frame in tone:
        rx.on_packet(builder.packet(alice.encrypt_opus(frame), **shape))
    assert rx.stats["ok"] == 50, rx.nonzero_stats()
    assert_tone(heard.pcm_of(ALICE))


def test_frame_attributed_to_wrong_user_fails_dave_and_is_never_heard(dave_call, tone):
    group, conn, rx, heard, senders = dave_call
    rx.on_ws_message(speaking(BOB, ALICE_SSRC))  # a lie about who owns Alice's SSRC
    for frame in tone[:5]:
        rx.on_packet(senders[ALICE].packet(frame))
    assert heard.frames == []
    assert sum(v for k, v in rx.stats.items() if k.startswith("dave_fail:")) == 5


def test_unmapped_speaker_identified_by_trial_decryption(dave_call, tone):
    group, conn, rx, heard, senders = dave_call
    for frame in tone[:10]:
        rx.on_packet(senders[BOB].packet(frame))
    assert rx.stats["identified_by_dave"] == 1
    assert rx.user_for_ssrc(BOB_SSRC) == BOB and heard.users() == [BOB] * 10


def test_silence_before_identification_is_buffered_then_flushed(dave_call, tone):
    group, conn, rx, heard, senders = dave_call
    for _ in range(3):
        rx.on_packet(senders[ALICE].packet(OPUS_SILENCE))
    assert rx.stats["unmapped_buffered"] == 3
    rx.on_packet(senders[ALICE].packet(tone[0]))
    assert heard.users() == [ALICE] * 4 and rx.stats["identified_by_dave"] == 1


def test_speaker_joining_and_leaving_changes_epoch_and_audio_survives(dave_call, tone):
    group, conn, rx, heard, senders = dave_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    for frame in tone[:10]:
        rx.on_packet(senders[ALICE].packet(frame))
    epoch = group.epoch
    carol = group.join(CAROL)
    assert group.epoch == epoch + 1
    carol_sender = DiscordSender(CAROL_SSRC, conn.secret_key, carol)
    rx.on_ws_message(speaking(CAROL, CAROL_SSRC))
    for frame in tone[10:20]:
        rx.on_packet(senders[ALICE].packet(frame))
        rx.on_packet(carol_sender.packet(frame))
    group.leave(CAROL)
    rx.on_ws_message({"op": 13, "d": {"user_id": str(CAROL)}})
    for frame in tone[20:30]:
        rx.on_packet(senders[ALICE].packet(frame))
    assert heard.users().count(ALICE) == 30 and heard.users().count(CAROL) == 10
    assert rx.stats["ok"] == 40, rx.nonzero_stats()


def test_reinitialised_session_mid_stream(dave_call, tone):
    group, conn, rx, heard, senders = dave_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    bot_session = conn.dave_session
    for frame in tone[:10]:
        rx.on_packet(senders[ALICE].packet(frame))
    group.reinit(BOT)  # the same object, re-initialised in place (discord.py's op 24 path)
    assert conn.dave_session is bot_session and bot_session.ready
    for frame in tone[10:20]:
        rx.on_packet(senders[ALICE].packet(frame))
    assert heard.users().count(ALICE) == 20, rx.nonzero_stats()


def test_replaced_session_object_is_read_per_packet(dave_call, tone):
    group, conn, rx, heard, senders = dave_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    rx.on_packet(senders[ALICE].packet(tone[0]))
    group.leave(BOT)
    conn.dave_session = group.join(BOT)  # a brand-new DaveSession object on the connection
    rx.on_packet(senders[ALICE].packet(tone[1]))
    assert heard.users() == [ALICE, ALICE], rx.nonzero_stats()


def test_session_not_ready_drops_dave_frames_but_passes_plain_opus(dave_call, tone):
    group, conn, rx, heard, senders = dave_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    dave_frame = senders[ALICE].packet(tone[0])
    conn.dave_session = davey.DaveSession(1, BOT, CHANNEL)  # pending, not ready
    rx.on_packet(dave_frame)
    plain = ClientPacketBuilder(ALICE_SSRC, bytes(conn.secret_key), sequence=4000).packet(tone[1])
    rx.on_packet(plain)  # clients send plain Opus until they can encrypt
    assert rx.stats["dave_not_ready"] == 1 and heard.users() == [ALICE]


def test_dave_replay_with_fresh_transport_nonce_is_rejected(dave_call, tone):
    group, conn, rx, heard, senders = dave_call
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    alice = group.members[ALICE]
    frame = alice.encrypt_opus(tone[0])
    builder = ClientPacketBuilder(ALICE_SSRC, bytes(conn.secret_key))
    rx.on_packet(builder.packet(frame))
    rx.on_packet(builder.packet(frame))  # same DAVE frame re-wrapped under a new RTP seq/nonce
    assert heard.users() == [ALICE]
    assert rx.stats.get("dave_fail:NoValidCryptorFound") == 1


def test_deaf_detector_reports_packets_without_pcm(dave_call, tone):
    group, conn, rx, heard, senders = dave_call
    rx.on_ws_message(speaking(BOB, ALICE_SSRC))  # every frame will fail DAVE
    assert rx.check_deaf(now=0.0) is False
    for i, frame in enumerate(tone[:10]):
        rx.on_packet(senders[ALICE].packet(frame))
        rx.check_deaf(now=float(i))
    assert rx.check_deaf(now=6.0) is True or rx.stats["deaf_events"] == 1
    assert rx.stats["deaf"] == 1 and rx.stats["deaf_events"] == 1
    rx.on_ws_message(speaking(ALICE, ALICE_SSRC))
    rx.on_packet(senders[ALICE].packet(tone[10]))
    assert rx.check_deaf(now=7.0) is False and rx.stats["deaf"] == 0


# -- an SSRC handed to another user ------------------------------------------------------------------


SHARED_SSRC = 777


def test_op5_handing_an_ssrc_to_another_user_makes_the_next_frames_theirs_on_a_fresh_decoder(dave_call, tone):
    """Discord reuses SSRCs: once op 5 gives 777 to Bob, 777's audio is Bob's — never Alice's (who may be an
    operator) — and Bob's first frame decodes as on a new stream, with none of Alice's decoder state."""
    from voice.media.opus import OpusDecoder

    group, conn, rx, heard, senders = dave_call
    alice = DiscordSender(SHARED_SSRC, conn.secret_key, senders[ALICE].dave_session)
    rx.on_ws_message(speaking(ALICE, SHARED_SSRC))
    for frame in tone[:10]:
        rx.on_packet(alice.packet(frame))
    rx.on_ws_message(speaking(BOB, SHARED_SSRC))
    bob = DiscordSender(SHARED_SSRC, conn.secret_key, senders[BOB].dave_session, sequence=alice.sequence,
                        timestamp=alice.timestamp)  # Bob's stream takes over where Alice's left off
    bob_tone = opus_frames(660.0, 10)
    for frame in bob_tone:
        rx.on_packet(bob.packet(frame))
    assert heard.users() == [ALICE] * 10 + [BOB] * 10, rx.nonzero_stats()
    assert rx.user_for_ssrc(SHARED_SSRC) == BOB and not any(k.startswith("dave_fail") for k in rx.stats)
    first_of_bob = heard.frames[10][2]
    assert first_of_bob == OpusDecoder().decode(bob_tone[0])  # a fresh decoder's output, bit for bit


def test_op5_handing_an_ssrc_to_another_user_whose_sequence_starts_behind_keeps_their_audio(plain_call, tone):
    """The new owner's RTP sequence is their own: numbers the previous owner already used are not replays."""
    conn, rx, heard, key = plain_call
    alice = DiscordSender(SHARED_SSRC, list(key), sequence=3000)
    rx.on_ws_message(speaking(ALICE, SHARED_SSRC))
    for frame in tone[:40]:
        rx.on_packet(alice.packet(frame))
    rx.on_ws_message(speaking(BOB, SHARED_SSRC))
    bob = DiscordSender(SHARED_SSRC, list(key), sequence=3005)  # behind Alice's last number (3039)
    for frame in tone[40:50]:
        rx.on_packet(bob.packet(frame))
    assert heard.users() == [ALICE] * 40 + [BOB] * 10, rx.nonzero_stats()
    assert rx.stats["duplicate"] == rx.stats["stale"] == 0


def test_the_receiver_can_decode_straight_to_the_models_24_khz_mono():
    group = DaveGroup(CHANNEL)
    bot, alice = group.join(BOT), group.join(ALICE)
    key = os.urandom(32)
    got: list[bytes] = []
    rx = Receiver(FakeConnection(list(key), ssrc=1, dave_session=bot, dave_protocol_version=1),
                  lambda user, ssrc, pcm: got.append(pcm), pcm_rate=24_000, pcm_channels=1)
    sender = DiscordSender(777, list(key), alice)
    rx.on_ws_message({"op": 5, "d": {"user_id": str(ALICE), "ssrc": 777, "speaking": 1}})
    for frame in opus_frames(523.0, 30):
        rx.on_packet(sender.packet(frame))
    assert len(got) == 30 and {len(p) for p in got} == {960}  # 20 ms of 24 kHz mono s16le
    mono = np.frombuffer(b"".join(got[5:]), dtype="<i2").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(mono))
    assert abs(np.argmax(spectrum) * 24_000 / len(mono) - 523.0) < 5  # the same tone, at the model's rate
