"""Receive-path benchmark: µs per packet for one speaker's genuine DAVE + transport packets.

  (a) floor: raw libopus, one opus_decode call per frame into a reused buffer
  (b) discord.py's opus.Decoder.decode of the same frames (what most bots use)
  (c) our whole path: Receiver.on_packet -> transport decrypt -> DAVE decrypt -> decode -> on_audio

Rounds are interleaved (a b c a b c ...) and medians reported. DAVE rejects replayed frames, so
every round of (c) gets fresh packets from one continuous stream; (a) and (b) decode exactly the
Opus frames that were inside that round's packets. Goal: (c)/(a) <= 2.0 (see GOAL_RATIO).
Run: .venv/bin/python bench/receive.py [--rounds N] [--packets N]
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import discord.opus  # noqa: E402
import numpy as np  # noqa: E402

from bench.goals import goal  # noqa: E402
from tests.support.dave_group import DaveGroup  # noqa: E402
from tests.support.packets import DiscordSender, FakeConnection  # noqa: E402
from voice.media.opus import load_libopus  # noqa: E402
from voice.media.receive import Receiver  # noqa: E402

# The whole receive path (transport, DAVE decryption, decode) costs at most twice the bare decode: what it
# adds must stay below what decoding itself costs, or receive, not the codec, would bound a room's size.
GOAL_RATIO = 2.0

CHANNEL, BOT, ALICE, SSRC = 1_300_000_000_000_000_001, 3_000_000_000_000_000_001, 3_000_000_000_000_000_002, 4242


def speechlike_opus(frames: int) -> list[bytes]:
    """Voice-like Opus frames: a gliding harmonic tone with noise and a syllable envelope."""
    rng = np.random.default_rng(7)
    enc = discord.opus.Encoder()
    n = 960 * frames
    t = np.arange(n) / 48_000
    f0 = 140 + 40 * np.sin(2 * math.pi * 0.7 * t)
    phase = 2 * math.pi * np.cumsum(f0) / 48_000
    voice = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.55 + 0.45 * np.sin(2 * math.pi * 3.0 * t)
    signal = 0.25 * voice * envelope + 0.02 * rng.standard_normal(n)
    pcm = np.repeat((signal * 32767 / np.max(np.abs(signal)) * 0.5).astype("<i2"), 2).tobytes()
    return [enc.encode(pcm[i * 3840:(i + 1) * 3840], 960) for i in range(frames)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--packets", type=int, default=1000)
    args = parser.parse_args()
    rounds, per_round = args.rounds, args.packets

    group = DaveGroup(CHANNEL)
    bot, alice = group.join(BOT), group.join(ALICE)
    key = os.urandom(32)
    conn = FakeConnection(list(key), ssrc=1, dave_session=bot, dave_protocol_version=1)
    base = speechlike_opus(500)
    frames = [base[i % len(base)] for i in range(rounds * per_round)]
    sender = DiscordSender(SSRC, list(key), alice)
    packets = [sender.packet(f) for f in frames]

    lib = load_libopus()
    err = ctypes.c_int()
    raw_state = lib.opus_decoder_create(48_000, 2, ctypes.byref(err))
    raw_buf = (ctypes.c_int16 * (5760 * 2))()
    raw_decode = lib.opus_decode
    dpy = discord.opus.Decoder()
    delivered = [0]

    def on_audio(user_id: int, ssrc: int, pcm: bytes) -> None:
        delivered[0] += 1

    rx = Receiver(conn, on_audio)
    rx.on_ws_message({"op": 5, "d": {"user_id": str(ALICE), "ssrc": SSRC, "speaking": 1}})

    def run_a(chunk: list[bytes]) -> float:
        t = time.perf_counter()
        for f in chunk:
            raw_decode(raw_state, f, len(f), raw_buf, 5760, 0)
        return time.perf_counter() - t

    def run_b(chunk: list[bytes]) -> float:
        decode = dpy.decode
        t = time.perf_counter()
        for f in chunk:
            decode(f, fec=False)
        return time.perf_counter() - t

    def run_c(chunk: list[bytes]) -> float:
        on_packet = rx.on_packet
        t = time.perf_counter()
        for p in chunk:
            on_packet(p)
        return time.perf_counter() - t

    a_us, b_us, c_us = [], [], []
    for r in range(rounds):
        sl = slice(r * per_round, (r + 1) * per_round)
        a_us.append(run_a(frames[sl]) / per_round * 1e6)
        b_us.append(run_b(frames[sl]) / per_round * 1e6)
        c_us.append(run_c(packets[sl]) / per_round * 1e6)

    assert delivered[0] == rounds * per_round, (delivered[0], rx.nonzero_stats())
    a, b, c = statistics.median(a_us), statistics.median(b_us), statistics.median(c_us)
    print(f"packets: {rounds} rounds x {per_round}, one speaker, DAVE + aead_xchacha20_poly1305_rtpsize")
    print(f"ratio: {c / a:.3f}")
    print(f"vs discord.py decoder: {c / b:.3f}")
    print(f"(a) raw libopus decode:     {a:7.2f} us/packet")
    print(f"(b) discord.py Decoder:     {b:7.2f} us/packet  ({b / a:.2f}x floor)")
    print(f"(c) Receiver.on_packet:     {c:7.2f} us/packet  ({c / a:.2f}x floor)")
    print(f"receiver stats: {rx.nonzero_stats()}")
    goal("receive", f"(c)/(a) whole receive path / raw libopus decode {c / a:.2f}", f"<= {GOAL_RATIO:g}",
         c / a <= GOAL_RATIO)


if __name__ == "__main__":
    main()
