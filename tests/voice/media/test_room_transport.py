"""The Discord room as a transport: every member on their own (never mixed), VAD only for members who
send, a bounded backlog, and one clock with one batched VAD run for every call in the process."""

from __future__ import annotations

import asyncio

import numpy as np

from voice.call.vad import DetectorBank, EnergyDetector
from voice.media.channel import MAX_QUEUED_FRAMES, RoomClock, RoomTransport

ALICE, BOB, CAROL = 111111111111111111, 222222222222222222, 333333333333333333


def stereo_frame(seed: int, amplitude: int = 6000) -> bytes:
    """20 ms of 48 kHz stereo s16le noise (seeded)."""
    rng = np.random.default_rng(seed)
    mono = (rng.standard_normal(960) * amplitude).clip(-32768, 32767).astype("<i2")
    return np.repeat(mono, 2).tobytes()


class CountingBank(DetectorBank):
    def __init__(self) -> None:
        super().__init__(EnergyDetector)
        self.runs: list[int] = []

    def run(self, streams) -> int:
        ran = super().run(streams)
        if ran:
            self.runs.append(ran)
        return ran


def test_each_member_is_their_own_frame_and_a_silent_member_costs_no_vad_work():
    bank = CountingBank()
    room = RoomTransport(vad=bank)
    for i in range(6):
        room.on_speech(ALICE, 1, stereo_frame(i))
        room.on_speech(BOB, 2, stereo_frame(100 + i))
    ticks = [room.tick() for _ in range(8)]
    assert all(set(t.frames) <= {ALICE, BOB} for t in ticks) and ticks[-1].frames == {}
    alice = [t.frames[ALICE].pcm for t in ticks if ALICE in t.frames]
    bob = [t.frames[BOB].pcm for t in ticks if BOB in t.frames]
    assert len(alice) == len(bob) >= 4  # the resampler holds back a little; every whole frame comes out
    assert all(a != b for a, b in zip(alice, bob, strict=True))  # each member's own audio, never a mix
    assert sum(bank.runs) == len(alice) + len(bob)  # scored once per frame sent; nothing for the empty ticks


def test_a_member_who_falls_behind_sheds_their_oldest_audio_to_keep_the_delay_bounded():
    room = RoomTransport()
    for i in range(MAX_QUEUED_FRAMES + 40):
        room.on_speech(ALICE, 1, stereo_frame(i))
    assert room.frames_shed >= 35  # (the resampler holds back a frame or two)
    frames = 0
    while room.tick().frames:
        frames += 1
    assert frames <= MAX_QUEUED_FRAMES  # at most 500 ms behind


async def test_one_clock_runs_the_vad_once_per_tick_over_every_room_in_the_process():
    bank = CountingBank()
    steps = asyncio.Event()

    async def next_tick(_delay: float) -> None:
        steps.set()
        await asyncio.sleep(0)

    clock = RoomClock(bank, sleep=next_tick)
    rooms = [RoomTransport(vad=bank, room_clock=clock) for _ in range(3)]
    for n, room in enumerate(rooms):
        for i in range(8):
            room.on_speech(ALICE + n, 1, stereo_frame(10 * n + i))
    got: list[list] = [[] for _ in rooms]

    async def consume(index: int, room: RoomTransport) -> None:
        async for tick in room.frames():
            got[index].append(tick)
            if len(got[index]) >= 12:
                room.close()

    await asyncio.wait_for(asyncio.gather(*(consume(i, r) for i, r in enumerate(rooms))), 10)
    heard = [sum(1 for t in g if t.frames) for g in got]
    assert heard[0] >= 6 and heard == [heard[0]] * 3  # every whole frame of every room arrived
    assert bank.runs[:heard[0]] == [3] * heard[0]  # one run per tick, all three rooms' members in it
    await clock.aclose()


def test_frames_already_in_the_models_format_are_queued_as_they_are():
    room = RoomTransport()
    frames = [np.full(480, 1000 + i, dtype="<i2").tobytes() for i in range(3)]  # 20 ms of 24 kHz mono each
    for frame in frames:
        room.on_speech(ALICE, 1, frame)
    assert [room.tick().frames[ALICE].pcm for _ in frames] == frames  # no resampler delay, no change
