"""Calls per core: how many guild calls one process keeps on time, pinned to one core.

N calls in this process, pinned to core 0 (os.sched_setaffinity(0, {0}), before any thread starts).
Each call has one speaker sending genuine DAVE-encrypted espeak-ng speech at 50 packets/s (their own
sentence, then 700 ms of quiet room noise at -50 dBFS — above Silero's -60 dBFS floor, so every
frame is decoded, resampled and scored, and turns still end), into that call's own pipeline:

  --shell discord (default, the bot's shape): a real `ListeningVoiceClient` per call (built offline:
      no gateway; its `VoiceConnectionState` gets a UDP socket on loopback, the transport key, a
      ready `davey` session of the call's own DaveGroup, and is set `connected`), so discord.py's
      own `SocketReader` thread per call runs `Receiver.on_packet` and hands every frame to the loop
      with `call_soon_threadsafe` -> `RoomTransport.on_speech`. The packets come over loopback UDP
      from a sender process on core 1 (one scheduler, each call on its own 20 ms phase), so sending
      costs the pinned core nothing. --playback adds what the bot also runs per call:
      `vc.play(transport.source)`, discord.py's `AudioPlayer` thread (Opus-encodes 50 frames/s,
      silence included, DAVE + transport encryption, UDP send).
  --shell loop (the same work without discord.py's threads): one asyncio task per call calls
      `Receiver.on_packet` on the loop on a 20 ms schedule, with the packets built beforehand.

then `RoomTransport` -> the process's one `RoomClock` (one 20 ms tick for every call and ONE batched
run of the shared `SileroBank` over every call's speakers, as the bot has) -> each
call's `CallEngine` (local endpointing, answers everyone, the bot's room options) -> its provider
socket: the project's fake Realtime GA server in its own process on core 1 (`python -m
tests.support.fake_realtime`, every event schema-checked there; its work does not count against core
0). It answers every turn with a 1.2 s tone, which the engine streams into the call's playback source.

Late ticks: the bench injects the room clock's `sleep` and rebuilds its schedule (including the reset
after a >200 ms stall), stamps each `RoomTick` with the due time of the clock tick that made it, and
measures when each call's `RoomTransport.frames()` hands it to its engine. A tick is late when that
is more than 20 ms after its due time; counted over the measured window (after a 1 s warm-up), all
calls together. A trial passes with <= 1% of ticks late (the clock's own late ticks are printed too).
N goes 10, 20, 30, ... and stops at the first failure; then the midpoint between the last pass and
the failure is tried once. A failing trial during which other processes used > 10% of core 0
(/proc/stat) is run once more.

Baseline, per N, same process and core, no asyncio, no threads: the same N calls' pure compute in a
tight loop (per 20 ms tick: every call's packet through its own Receiver and RoomTransport.on_speech,
then every room's `collect`, one batched `run_vad`, every room's `publish`, as `RoomClock.tick`
does: decrypt, decode, resample, VAD), CPU time per tick; calls per core upper bound = 20 ms / (CPU
per call per tick). Also (+turns) with each call's CallCore.on_room_audio, and (per-call) with each
room scored on its own (`RoomTransport.tick`: one model run per call, the shape before the clock).

Run: .venv/bin/python bench/calls_per_core.py [--quick] [--shell discord|loop] [--playback]
     [--calls 10,20,30,40,50,60] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import pickle
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.goals import goal  # noqa: E402

PERIOD = 0.020
LATE_S = 0.020
LATE_LIMIT = 0.01
WARMUP_S = 1.0
DISTURBED = 0.10  # a failing trial while other processes used more than this share of core 0 is run again
CHANNEL0, BOT, USER0, SSRC = 1_400_000_000_000_000_000, 3_100_000_000_000_000_001, 3_100_000_000_000_000_100, 7000


# -- child processes (core 1) ------------------------------------------------------------------------


def sender_main() -> None:
    """The packet sender: pinned to core 1; prints its UDP port, then reads a pickle path and a start time."""
    os.sched_setaffinity(0, {1})
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # playback packets land here and are dropped
    print(sock.getsockname()[1], flush=True)
    with open(sys.stdin.readline().strip(), "rb") as f:
        plan = pickle.load(f)
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    events = sorted((start + k * PERIOD + phase, port, packet)
                    for port, phase, packets in zip(plan["ports"], plan["phases"], plan["packets"], strict=True)
                    for k, packet in enumerate(packets))
    late = []
    sendto = sock.sendto
    for due, port, packet in events:
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        late.append(time.monotonic() - due)
        sendto(packet, ("127.0.0.1", port))
    late.sort()
    print(json.dumps({"sent": len(late), "p99_ms": late[int(len(late) * 0.99)] * 1000 if late else 0,
                      "max_ms": late[-1] * 1000 if late else 0,
                      "over_5ms": sum(x > 0.005 for x in late)}), flush=True)


def fake_main(args: list[str]) -> None:
    """The fake Realtime server, pinned to core 1."""
    os.sched_setaffinity(0, {1})
    from tests.support.fake_realtime import main

    sys.exit(main(args))


# -- the pinned process -------------------------------------------------------------------------------

if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] in ("--sender", "--fake"):
    if sys.argv[1] == "--sender":
        sender_main()
    else:
        fake_main(sys.argv[2:])
    sys.exit(0)

import discord  # noqa: E402
import discord.opus  # noqa: E402
from discord.voice_state import ConnectionFlowState  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

from bench.discord_call import ProviderAnswers, make_core, talking  # noqa: E402
from tests.support.dave_group import DaveGroup  # noqa: E402
from tests.support.packets import XCHACHA, DiscordSender, FakeConnection  # noqa: E402
from voice.call.actions import PlaybackPosition  # noqa: E402
from voice.call.attribution import CallInfo  # noqa: E402
from voice.call.core import CallOptions  # noqa: E402
from voice.call.engine import CallEngine  # noqa: E402
from voice.call.identity import Identity  # noqa: E402
from voice.call.providers import OpenAIRealtime  # noqa: E402
from voice.call.silero_batch import SileroBank  # noqa: E402
from voice.call.tools import ToolCatalogue  # noqa: E402
from voice.call.transports.base import RoomTick  # noqa: E402
from voice.call.vad import VadConfig  # noqa: E402
from voice.media.channel import RoomClock, RoomTransport, run_vad  # noqa: E402
from voice.media.discord_client import ListeningVoiceClient  # noqa: E402
from voice.media.receive import Receiver  # noqa: E402

POSITION = PlaybackPosition()


class Pacing:
    """Rebuilds a 20 ms loop's schedule (`RoomClock._run`: sleep `max(0, next_at - now)`, and reset
    `next_at` to now after falling more than 200 ms behind) from the sleeps it asks for."""

    def __init__(self) -> None:
        self.due: float | None = None  # when the tick running now was due
        self.samples: list[tuple[float, float]] = []  # (when, how late) per tick

    def ticked(self) -> None:
        now = time.monotonic()
        if self.due is None:
            self.due = now
        self.samples.append((now, now - self.due))

    async def sleep(self, delay: float) -> None:
        now = time.monotonic()
        following = self.due + PERIOD
        if delay > 0:
            self.due = now + delay
        elif following - now < -0.2:
            self.due = now
        else:
            self.due = following
        await asyncio.sleep(delay)


class PacedClock(RoomClock):
    """The process's `RoomClock`, its ticks stamped by a `Pacing` (its `sleep` is the pacing's)."""

    def __init__(self, vad: SileroBank) -> None:
        self.pacing = Pacing()
        super().__init__(vad, sleep=self.pacing.sleep)

    def tick(self) -> None:
        self.pacing.ticked()
        super().tick()


@dataclass(frozen=True)
class StampedTick(RoomTick):
    due: float = 0.0  # when the room clock's tick that made it was due


class PacedRoom(RoomTransport):
    """A `RoomTransport` that stamps how late each tick reaches its engine: `frames()` yielding it,
    against when the clock's tick that made it was due."""

    def __init__(self, *, room_clock: PacedClock, **kwargs) -> None:
        super().__init__(room_clock=room_clock, **kwargs)
        self.paced_by = room_clock
        self.samples: list[tuple[float, float]] = []  # (when, how late) per tick

    def deliver(self, tick: RoomTick) -> None:
        super().deliver(StampedTick(tick.frames, tick.names, self.paced_by.pacing.due))

    async def frames(self):
        async for tick in super().frames():
            now = time.monotonic()
            self.samples.append((now, now - tick.due))
            yield tick


class _Guild:
    def __init__(self, guild_id: int) -> None:
        self.id = guild_id


class _Channel:
    def __init__(self, channel_id: int) -> None:
        self.id = channel_id
        self.guild = _Guild(channel_id)


class _VoiceWebsocket:
    """What discord.py's AudioPlayer touches on the voice websocket: SPEAKING."""

    async def speak(self, state: object) -> None:
        return None


class Call:
    """One guild call: its DAVE group, speaker, transport, engine and (shell discord) voice client."""

    def __init__(self, index: int, *, shell: str, bank: SileroBank, room_clock: PacedClock, url: str,
                 client: discord.Client | None, sender_port: int | None, rng: random.Random, playback: bool,
                 compression: str) -> None:
        self.index = index
        self.group = DaveGroup(CHANNEL0 + index)
        self.bot = self.group.join(BOT)
        self.user_id = USER0 + index
        speaker = self.group.join(self.user_id)
        self.key = [rng.randrange(256) for _ in range(32)]
        self.sender = DiscordSender(SSRC, self.key, speaker)
        pcm = talking(index)
        encoder = discord.opus.Encoder()
        self.opus = [encoder.encode(f, 960) for f in pcm]
        self.at = rng.randrange(len(self.opus))
        self.phase = rng.random() * PERIOD
        loop = asyncio.get_running_loop()
        self.transport = PacedRoom(names=lambda uid: f"member{uid % 1000}", loop=loop, vad=bank,
                                   room_clock=room_clock)
        self.vc: ListeningVoiceClient | None = None
        self.sock: socket.socket | None = None
        if shell == "discord":
            self.vc = ListeningVoiceClient(client, _Channel(CHANNEL0 + index), pcm_rate=24_000, pcm_channels=1)
            conn = self.vc._connection
            conn.secret_key, conn.mode, conn.ssrc = list(self.key), XCHACHA, 1
            conn.dave_session, conn.dave_protocol_version = self.bot, 1
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.sock.bind(("127.0.0.1", 0))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            self.sock.connect(("127.0.0.1", sender_port))  # what discord.py's socket talks to: the sender
            self.sock.setblocking(False)
            conn.socket = self.sock
            conn.ws = _VoiceWebsocket()
            self.receiver = self.vc.receiver
            self.vc.add_sink(self.transport.on_speech)
            conn.state = ConnectionFlowState.connected  # the receiver now listens on the reader thread
            # discord.py starts its reader paused from inside the new thread; joined this fast, that
            # pause can land after the listener's registration resumed it (a real join takes longer)
            conn._socket_reader.resume()
        else:
            conn = FakeConnection(list(self.key), ssrc=1, dave_session=self.bot, dave_protocol_version=1)
            self.receiver = Receiver(conn, self.transport.on_speech, pcm_rate=24_000, pcm_channels=1)
        self.receiver.on_ws_message({"op": 5, "d": {"user_id": str(self.user_id), "ssrc": SSRC, "speaking": 1}})
        provider = OpenAIRealtime("bench", "gpt-realtime-2.1-mini", "marin", url=url)
        options = CallOptions(endpointing="local", vad=VadConfig(), reply_to="everyone", followup_s=15.0,
                              min_interruption_ms=400)  # the bot's room defaults (bot/discord/calls.py)
        extra = {} if compression == "deflate" else {"connector": connect_uncompressed}
        self.engine = CallEngine(provider, self.transport, ToolCatalogue(), Identity("You are a bench."),
                                 options=options, call=CallInfo(f"bench-{index}", CHANNEL0 + index, CHANNEL0 + index),
                                 vad_name=bank.name, **extra)
        self.task: asyncio.Task | None = None
        self.playback = playback

    def packets(self, count: int) -> list[bytes]:
        """The next `count` genuine packets of this call's speaker (continuing their streams)."""
        n = len(self.opus)
        out = [self.sender.packet(self.opus[(self.at + k) % n]) for k in range(count)]
        self.at += count
        return out

    def start(self) -> None:
        self.task = asyncio.create_task(self.engine.run(), name=f"call-{self.index}")
        if self.playback and self.vc is not None:
            self.vc.play(self.transport.source)

    async def stop(self) -> None:
        self.engine.stop()
        if self.task is not None:
            try:
                await self.task
            except Exception as exc:  # a call that failed is reported, the others still stop
                logging.warning("call %d ended with %r", self.index, exc)
        if self.vc is not None:
            self.vc.stop()
            reader = self.vc._connection._socket_reader
            reader.stop()
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader's select() so the thread ends now
            await asyncio.to_thread(reader.join, 2)
        if self.sock is not None:
            self.sock.close()


async def connect_uncompressed(url: str, headers: dict[str, str]):
    """--compression none: the engine's own connector's settings, without permessage-deflate."""
    return await connect(url, additional_headers=headers, max_size=16 * 1024 * 1024, open_timeout=15,
                         close_timeout=2, compression=None)


async def drive_on_loop(call: Call, packets: list[bytes], start: float) -> None:
    """--shell loop: the call's packets into its Receiver on the loop, one every 20 ms."""
    on_packet = call.receiver.on_packet
    due = start + call.phase
    for packet in packets:
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        on_packet(packet)
        due += PERIOD


def spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


async def trial(n: int, args: argparse.Namespace, bank: SileroBank, url: str, rng: random.Random) -> dict:
    """N calls for `args.seconds` (after the warm-up): lateness, CPU, and the compute baseline."""
    ticks_live = int((WARMUP_S + args.seconds) / PERIOD) + 10  # the window, and 200 ms for the stop
    sender = spawn(["--sender"]) if args.shell == "discord" else None
    client = None
    if args.shell == "discord":
        client = discord.Client(intents=discord.Intents.none())
        client._connection.loop = asyncio.get_running_loop()
    port = int(sender.stdout.readline()) if sender else None
    room_clock = PacedClock(bank)  # one for the process, as the bot has (bot/discord/calls.py)
    calls = [Call(i, shell=args.shell, bank=bank, room_clock=room_clock, url=url, client=client, sender_port=port,
                  rng=rng, playback=args.playback, compression=args.compression) for i in range(n)]
    live = [c.packets(ticks_live) for c in calls]  # untimed, before anything runs
    drivers: list[asyncio.Task] = []
    sender_stats: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if sender is not None:
                plan = Path(tmp) / "plan.pickle"
                with open(plan, "wb") as f:
                    pickle.dump({"ports": [c.sock.getsockname()[1] for c in calls],
                                 "phases": [c.phase for c in calls], "packets": live}, f)
                sender.stdin.write(f"{plan}\n")
                sender.stdin.flush()
                assert sender.stdout.readline().strip() == "ready"
            for c in calls:
                c.start()
            while not all(c.engine.core.connected for c in calls):
                await asyncio.sleep(0.05)
            start = time.monotonic() + 0.2
            if sender is not None:
                sender.stdin.write(f"{start}\n")
                sender.stdin.flush()
            else:
                drivers = [asyncio.create_task(drive_on_loop(c, p, start)) for c, p in zip(calls, live, strict=True)]
            begin, end = start + WARMUP_S, start + WARMUP_S + args.seconds
            await asyncio.sleep(begin - time.monotonic())
            if BREAKDOWN is not None:
                BREAKDOWN.start()
            cpu0, busy0, threads0, wall0 = time.process_time(), core_busy(0), thread_cpu(), time.monotonic()
            await asyncio.sleep(end - time.monotonic())
            threads1 = thread_cpu()
            parts = BREAKDOWN.stop() if BREAKDOWN is not None else {}
            wall = time.monotonic() - wall0
            cpu = (time.process_time() - cpu0) / wall
            others = max(0.0, (core_busy(0) - busy0) / wall - cpu)
        finally:
            for d in drivers:
                d.cancel()
            for c in calls:
                await c.stop()
            await room_clock.aclose()
            if sender is not None:
                out, _ = await asyncio.to_thread(sender.communicate, None, 60)
                sender_stats = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    late = sorted(lateness for c in calls for when, lateness in c.transport.samples if begin <= when < end)
    clock_late = [lateness for when, lateness in room_clock.pacing.samples if begin <= when < end]
    expected = int(args.seconds / PERIOD) * n
    result = {
        "n": n, "ticks": len(late), "expected": expected,
        "late": sum(x > LATE_S for x in late),
        "p50_ms": late[len(late) // 2] * 1000 if late else float("nan"),
        "p99_ms": late[int(len(late) * 0.99)] * 1000 if late else float("nan"),
        "max_ms": late[-1] * 1000 if late else float("nan"),
        "clock_late": sum(x > LATE_S for x in clock_late) / max(1, len(clock_late)),
        "clock_ticks": len(clock_late),
        "cpu": cpu,
        "parts": {k: v / (wall / PERIOD) / n for k, v in parts.items()},  # CPU s per call per tick
        "threads": {kind: (threads1.get(kind, 0.0) - threads0.get(kind, 0.0)) / wall for kind in threads1},
        "others": others,
        "shed": sum(c.transport.frames_shed for c in calls),
        "decoded": sum(c.receiver.stats["ok"] for c in calls),
        "sent": int((WARMUP_S + args.seconds) / PERIOD) * n,  # due before the stop (10 more per call follow)
        "commits": sum(c.engine.core.counters["turns"] for c in calls),
        "barge_ins": sum(c.engine.core.counters["barge_ins"] for c in calls),
        "sender": sender_stats,
    }
    result["late_frac"] = result["late"] / max(1, result["ticks"])
    result["ok"] = result["late_frac"] <= LATE_LIMIT and result["ticks"] >= 0.9 * expected
    result["baseline"] = compute_baseline(calls, bank, args.baseline_ticks)
    return result


class Breakdown:
    """--breakdown: the event loop thread's CPU by component, exclusive (a wrapped call inside another
    counts only for itself), from `time.thread_time` around each wrapped function while `on`; what is
    left of the thread's CPU is asyncio itself (task steps, queues, timers, the self-pipe, select) and
    the engine's async glue (`_pump_input`, `_writer`, `frames()`, json.dumps)."""

    def __init__(self) -> None:
        import asyncio.selector_events

        import websockets.protocol

        from voice.call.core import CallCore
        from voice.call.engine import CallEngine as Engine

        self.loop_thread = threading.get_ident()
        self.on = False
        self.spent: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[list] = []
        targets = [
            ("receive (Receiver.on_packet)", Receiver, "on_packet"),
            ("resample (RoomTransport.on_speech)", RoomTransport, "on_speech"),
            ("hand-off (ListeningVoiceClient._dispatch)", ListeningVoiceClient, "_dispatch"),
            ("room clock tick (collect, VAD, publish, deliver)", RoomClock, "tick"),
            ("turns (CallCore.on_room_audio)", CallCore, "on_room_audio"),
            ("actions (CallEngine._execute)", Engine, "_execute"),
            ("provider events in (CallEngine._on_message)", Engine, "_on_message"),
            ("websocket framing + deflate (Protocol.send_text)", websockets.protocol.Protocol, "send_text"),
            ("socket write (transport.write)", asyncio.selector_events._SelectorSocketTransport, "write"),
        ]
        for label, cls, name in targets:
            setattr(cls, name, self._wrap(label, getattr(cls, name)))

    def _wrap(self, label: str, fn):
        def wrapped(*args, **kwargs):
            if not self.on or threading.get_ident() != self.loop_thread:
                return fn(*args, **kwargs)
            frame = [time.thread_time(), 0.0]
            self._stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                self._stack.pop()
                elapsed = time.thread_time() - frame[0]
                self.spent[label] = self.spent.get(label, 0.0) + elapsed - frame[1]
                self.calls[label] = self.calls.get(label, 0) + 1
                if self._stack:
                    self._stack[-1][1] += elapsed
        return wrapped

    def start(self) -> None:
        self.spent, self.calls, self.on = {}, {}, True

    def stop(self) -> dict[str, float]:
        self.on = False
        return dict(self.spent)


BREAKDOWN: Breakdown | None = None


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's threads, by kind: the event loop (this thread), discord.py's
    socket readers, its audio players, and the rest (/proc/self/task/*/stat)."""
    kinds = {t.native_id: t.name for t in threading.enumerate()}
    me = threading.get_native_id()
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        name = kinds.get(int(tid), "")
        kind = ("loop" if int(tid) == me else "readers" if name.startswith("voice-socket-reader")
                else "players" if name.startswith("audio-player") else "other")
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return out


def core_busy(core: int) -> float:
    """Seconds core `core` has spent busy since boot, every process counted (/proc/stat)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{core} "):
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in line.split()[1:9])
                return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    raise RuntimeError(f"no cpu{core} in /proc/stat")


def compute_baseline(calls: list[Call], bank: SileroBank, ticks: int) -> dict[str, float]:
    """CPU per call per 20 ms tick of the same calls' pure compute in a tight loop (see the module doc):
    `compute` ticks every room as `RoomClock.tick` does (collect, one batched `run_vad`, publish);
    `+turns` adds each call's CallCore.on_room_audio; `per-call` scores each room on its own
    (`RoomTransport.tick`, one model run per call: the shape before the room clock)."""
    out: dict[str, float] = {}
    for variant in ("compute", "+turns", "per-call"):
        rooms, receivers, cores = [], [], []
        for c in calls:
            room = RoomTransport(vad=bank, clock=lambda: 0.0)
            rx = Receiver(FakeConnection(list(c.key), ssrc=1, dave_session=c.bot, dave_protocol_version=1),
                          room.on_speech, pcm_rate=24_000, pcm_channels=1)
            rx.on_ws_message({"op": 5, "d": {"user_id": str(c.user_id), "ssrc": SSRC, "speaking": 1}})
            rooms.append(room)
            receivers.append(rx.on_packet)
            core = make_core() if variant == "+turns" else None
            cores.append((core, ProviderAnswers(core, 1000.0) if core else None))
        packets = [c.packets(ticks) for c in calls]  # untimed
        pairs = list(zip(receivers, packets, strict=True))
        now = 0.0
        t = time.process_time()
        for k in range(ticks):
            for on_packet, p in pairs:
                on_packet(p[k])
            if variant == "per-call":
                for room in rooms:
                    room.tick()
            else:
                streams = []
                for room in rooms:
                    streams += room.collect()
                run_vad(bank, streams)
                for room, (core, answers) in zip(rooms, cores, strict=True):
                    tick = room.publish()
                    if core is not None:
                        answers.carry(core.on_room_audio(tick, now, POSITION), now)
                        answers.tick(now)
            now += PERIOD
        out[variant] = (time.process_time() - t) / (ticks * len(calls))
    return out


async def run(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    bank = SileroBank()
    fake = spawn(["--fake", "--port", "0", "--audio-ms", "1200"])
    url = fake.stdout.readline().split(" on ", 1)[1].split(" ", 1)[0]
    fake.stdout.readline()
    results: list[dict] = []
    try:
        queue = sorted(int(x) for x in args.calls.split(","))
        passed, refine = 0, not args.no_refine
        while queue:
            n = queue.pop(0)
            r = await trial(n, args, bank, url, rng)
            if not r["ok"] and r["others"] > DISTURBED:  # other processes took core 0: try once more
                print_row(r, flush=True, note=f"other load {r['others']:.0%} on core 0: retried")
                r = await trial(n, args, bank, url, rng)
            results.append(r)
            print_row(r, flush=True, note=f"disturbed: other load {r['others']:.0%} on core 0"
                      if not r["ok"] and r["others"] > DISTURBED else "")
            if r["parts"]:
                print_breakdown(r)
            if r["ok"]:
                passed = max(passed, n)
                continue
            queue = []  # stop at the first failure; then try once between the last pass and it
            mid = (passed + n) // 2
            if refine and passed and passed < mid < n:
                queue, refine = [mid], False
    finally:
        fake.send_signal(signal.SIGINT)
        out, _ = fake.communicate(timeout=30)
    summary = [line for line in out.splitlines() if "violation" in line]
    print_summary(results, args, summary)


def header(args: argparse.Namespace) -> None:
    load = os.getloadavg()
    print(f"calls per core: --shell {args.shell}{' --playback' if args.playback else ''} --compression "
          f"{args.compression}; this process pinned to "
          f"core 0 of {os.cpu_count()}; sender and fake Realtime server processes on core 1; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start")
    print(f"each call: 1 speaker, 50 packets/s of genuine DAVE speech (sentence + 700 ms quiet noise), {args.seconds:g} s "
          f"measured after {WARMUP_S:g} s warm-up; late = a RoomTick reaching its engine (RoomTransport.frames()) > {LATE_S * 1000:.0f} ms after the room clock's tick was due; "
          f"pass = <= {LATE_LIMIT:.0%} late")
    print("baseline (same N calls, same core, no asyncio, no threads): CPU per call per 20 ms tick; bound = calls "
          "per core that CPU allows (20 ms / it)")
    print(f"{'N':>3} {'late':>7} {'clock':>7} {'ticks':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'core':>5} {'others':>6} "
          f"{'shed':>5} {'turns':>5} {'compute us':>10} {'bound':>5} {'+turns':>6} {'per-call':>8} {'N/bound':>7}  "
          f"{'sender ms':>11}  {'loop/rdr/player':>17}", flush=True)


def print_row(r: dict, flush: bool = False, note: str = "") -> None:
    b = r["baseline"]
    bound = PERIOD / b["compute"]
    sender = r["sender"]
    s = f"{sender.get('p99_ms', float('nan')):.1f}/{sender.get('max_ms', float('nan')):.1f}" if sender else "-"
    th = r["threads"]
    split = "/".join(f"{th.get(k, 0.0):.2f}" for k in ("loop", "readers", "players"))
    print(f"{r['n']:>3} {100 * r['late_frac']:>6.2f}% {100 * r['clock_late']:>6.2f}% {r['ticks']:>7} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} "
          f"{r['max_ms']:>7.1f} {r['cpu']:>5.2f} {r['others']:>6.2f} {r['shed']:>5} {r['commits']:>5} "
          f"{b['compute'] * 1e6:>10.0f} {bound:>5.0f} {PERIOD / b['+turns']:>6.0f} {PERIOD / b['per-call']:>8.0f} "
          f"{r['n'] / bound:>7.2f}  {s:>11}  {split:>17}  {'pass' if r['ok'] else 'FAIL'}"
          f"{'  (' + note + ')' if note else ''}", flush=flush)


def print_breakdown(r: dict) -> None:
    loop = r["threads"].get("loop", 0.0) * PERIOD / r["n"]  # loop thread CPU s per call per tick
    parts = r["parts"]
    print(f"      loop thread CPU per call per 20 ms tick, N={r['n']}: {loop * 1e6:.0f} us "
          f"(readers {r['threads'].get('readers', 0.0) * PERIOD / r['n'] * 1e6:.0f} us, "
          f"players {r['threads'].get('players', 0.0) * PERIOD / r['n'] * 1e6:.0f} us)")
    for label, value in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"        {value * 1e6:7.1f} us  {label}")
    print(f"        {(loop - sum(parts.values())) * 1e6:7.1f} us  the rest: asyncio (task steps, queues, timers, "
          f"self-pipe, select) and the engine's async glue")


def print_summary(results: list[dict], args: argparse.Namespace, fake_summary: list[str]) -> None:
    passed = [r["n"] for r in results if r["ok"]]
    best = max(passed) if passed else 0
    bounds = [PERIOD / r["baseline"]["compute"] for r in results]
    bound = statistics.median(bounds)
    print("   columns: late = ticks reaching their engine > 20 ms after due; clock = the room clock's own ticks "
          "> 20 ms late; p50/p99/max = lateness at the engine; core = this process's CPU "
          "(all threads) / wall over the window; others = other processes' CPU on core 0 / wall (/proc/stat); "
          "sender ms = the sender's own lateness p99/max; loop/rdr/player = CPU / wall of the event loop thread, "
          "discord.py's socket reader threads and audio player threads (/proc/self/task); shed = frames RoomTransport dropped (backlog > 500 ms); turns = "
          "commits; compute us = baseline CPU per call per tick; bound/+turns/per-call = 20 ms / that CPU")
    print(f"ratio: {best / bound:.2f}  (largest passing N / compute-only calls-per-core bound)")
    goal("calls_per_core", f"calls per core {best} (largest N with <= {LATE_LIMIT:.0%} late ticks)", ">= 40",
         best >= 40)
    print(f"calls per core: {best}; compute-only bound "
          f"{bound:.0f}, with turns {statistics.median(PERIOD / r['baseline']['+turns'] for r in results):.0f}, "
          f"VAD run per call instead of once per tick {statistics.median(PERIOD / r['baseline']['per-call'] for r in results):.0f}")
    disturbed = [r for r in results if not r["ok"] and r["others"] > DISTURBED]
    if disturbed:
        print(f"   NOTE: other processes took > {DISTURBED:.0%} of core 0 during the failing trial(s) at N = "
              f"{', '.join(str(r['n']) for r in disturbed)}, even when retried: a lower bound; rerun when quieter")
    for r in results:
        lost = r["sent"] - r["decoded"]
        if lost > 0:
            print(f"   N={r['n']}: {lost} of the {r['sent']} packets due before the stop were not decoded "
                  "(UDP drops, or still queued at the stop)")
    for line in fake_summary:
        print(f"   fake Realtime server: {line.strip()}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shell", choices=("discord", "loop"), default="discord")
    parser.add_argument("--playback", action="store_true", help="run discord.py's AudioPlayer per call (shell discord)")
    parser.add_argument("--calls", default="10,20,30,40,50,60")
    parser.add_argument("--compression", choices=("deflate", "none"), default="deflate",
                        help="the provider socket: deflate = what CallEngine's own connector negotiates (websockets' "
                             "default), none = permessage-deflate off (a bench-side connector)")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per trial")
    parser.add_argument("--baseline-ticks", type=int, default=50)
    parser.add_argument("--no-refine", action="store_true", help="do not try the midpoint after a failure")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="3 s per trial, 25 baseline ticks")
    parser.add_argument("--breakdown", action="store_true",
                        help="time the event loop thread's components (wrappers cost ~1 us per call)")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.baseline_ticks = 3.0, 25
    if args.playback and args.shell != "discord":
        parser.error("--playback needs --shell discord")
    os.sched_setaffinity(0, {0})  # before any thread exists: every thread of this process inherits it
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("discord").setLevel(logging.ERROR)  # "Guilds intent seems to be disabled": an offline client
    if args.breakdown:
        global BREAKDOWN
        BREAKDOWN = Breakdown()
    header(args)
    wall = time.perf_counter()
    asyncio.run(run(args))
    print(f"total wall {time.perf_counter() - wall:.1f} s; load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
