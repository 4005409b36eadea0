"""Discord call path benchmark: CPU per speaker with 1 / 5 / 10 / 25 people talking at once, the
endpointing delay per speaker, and addressed mode's transcription wait.

1. CPU (the headline). One call, N speakers active at the same time, every one of them sending a
   packet every 20 ms all along: each says their own espeak-ng sentence (a different text per
   speaker, voices vary), then 700 ms of quiet room noise at -50 dBFS (above Silero's floor, so those
   frames are decoded and scored too; long enough that turns end), looped from a per-speaker offset.
   Every speaker has their own SSRC and DAVE sender in one DaveGroup with the bot.
   One 20 ms tick of the whole path, in the order production runs it:

     receive   every speaker's genuine packet -> Receiver.on_packet (transport decrypt, replay
               window, DAVE decrypt, Opus decode to 48 kHz stereo)
     resample  RoomTransport.on_speech per frame (the receiver decodes straight to 24 kHz mono, as a call's
               does, so this is the hand-off and queue; 48 kHz input would be downmixed and resampled here)
     vad       RoomTransport.tick(): each member's oldest frame into their own stream of the shared
               SileroBank (24 -> 16 kHz, windows), one batched session.run per tick over everyone
     turns     CallCore.on_room_audio (local endpointing, per-speaker turns) with a real
               OpenAIRealtime provider object and no socket; the provider's side is played on the
               core's virtual clock (`ProviderAnswers`: every commit acknowledged, every
               response.create answered with response.created at once and response.done
               --answer-ms later, a response.cancel ends the answer at once)

   baseline: raw libopus, one ctypes opus_decode per frame into a reused buffer (as bench/receive.py),
   of exactly the Opus frames inside that round's packets, one decoder state per speaker.
   Each figure is CPU time (time.process_time: this process, all threads, so other load on the
   machine does not count) divided by the baseline's CPU time for the same N in the same round: the
   baseline scales with N, so the ratio is per speaker. Medians over rounds; rounds are interleaved
   (per round, per N: baseline then whole path; the N order rotates each round). DAVE rejects
   replayed frames, so every pass gets freshly built packets (untimed).
   Goal (the issue): ratio <= 3.0 at 25 speakers and flat in N (every N within 15% of their mean).

2. Endpointing delay per speaker, on the core's virtual time (20 ms ticks, no network jitter):
   each speaker says their sentence once (digital silence trimmed from both ends) and then sends
   nothing, as Discord clients do. Per speaker: last packet -> their turn ended (the VAD's end:
   ready to commit), ready -> their input_audio_buffer.commit (queue wait: a turn is committed only
   once the turn before it has been answered), and last packet -> commit. Scenarios: each speaker
   alone, and 10 at once (starts staggered by 0-300 ms, three different sets). The provider answer
   completes --answer-ms after response.create. Goal: median (last packet -> turn ended) <= silence
   window + 25 ms.

3. Addressed mode: a CallEngine in local endpointing with reply_to="addressed" and the listener's
   rule (`addresses_agent`, agent "Ares") against the fake Realtime server on loopback (in this
   process) with transcript_delay_ms 0 and 300; RoomTicks of real speech (Silero probabilities
   computed beforehand) pushed through VirtualTransport.push_tick: a turn's speech at once, then
   (once the fake has checked every append, so no backlog sits ahead of the commit) 700 ms of empty
   ticks in real time. Timed on the wire (a recording connector around the engine's websocket):
   response.create sent - commit sent, split at the transcription's arrival.
   Baseline: the same in everyone mode (no transcription wait).

Seeded (--seed): transport key, loop offsets, staggers. DAVE/MLS key material comes from the OS.
Run: .venv/bin/python bench/discord_call.py [--quick] [--rounds N] [--seconds S] [--answer-ms MS]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import functools
import itertools
import json
import logging
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import discord.opus  # noqa: E402
import numpy as np  # noqa: E402

from bench.goals import goal  # noqa: E402
from listener.named_commands import addresses_agent  # noqa: E402
from tests.support.dave_group import DaveGroup  # noqa: E402
from tests.support.fake_realtime import AudioReply, FakeRealtime  # noqa: E402
from tests.support.packets import DiscordSender, FakeConnection  # noqa: E402
from tests.support.speech import speech_frames  # noqa: E402
from tests.support.virtual_transport import VirtualTransport  # noqa: E402
from voice.audio import to_mono_24k  # noqa: E402
from voice.call import events as ev  # noqa: E402
from voice.call.actions import PlaybackPosition, Send  # noqa: E402
from voice.call.core import CallCore, CallOptions  # noqa: E402
from voice.call.engine import CallEngine  # noqa: E402
from voice.call.identity import Identity  # noqa: E402
from voice.call.providers import OpenAIRealtime, SessionConfig, ToolSpec  # noqa: E402
from voice.call.silero_batch import SileroBank  # noqa: E402
from voice.call.tools import ToolCatalogue  # noqa: E402
from voice.call.transports.base import HeardFrame, RoomTick  # noqa: E402
from voice.call.vad import VadConfig  # noqa: E402
from voice.media.channel import RoomTransport  # noqa: E402
from voice.media.opus import load_libopus  # noqa: E402
from voice.media.receive import Receiver  # noqa: E402

CHANNEL, BOT = 1_300_000_000_000_000_001, 3_000_000_000_000_000_001
USER0, SSRC0 = 3_000_000_000_000_000_100, 5000
COUNTS = (1, 5, 10, 25)
TICK_S = 0.02
GOAL_RATIO = 3.0
FLAT = 0.15
POSITION = PlaybackPosition()  # the bot is not playing anything
MIN_INTERRUPTION_MS = 400  # the bot's room default (bot/discord/calls.py RoomOptions)
clock = time.process_time

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Can somebody check whether the deploy finished?",
    "I think the build is broken again on main.",
    "Let's move the meeting to three o'clock tomorrow.",
    "Has anyone seen the latest error rates?",
    "Please read me the summary of the incident.",
    "My microphone was muted, sorry about that.",
    "We should roll back before the traffic peak.",
    "What is the weather like in Lisbon today?",
    "Okay, I will open a ticket for the database team.",
    "The new dashboard loads much faster than the old one.",
    "Who is on call for the payments service this week?",
    "I pushed a fix for the flaky login test an hour ago.",
    "Remind me to send the invoice before Friday.",
    "The staging database ran out of disk space again.",
    "Could you summarise what we decided last Tuesday?",
    "Our customers in Brazil are seeing slow checkouts.",
    "I will be out of office for the next two weeks.",
    "Let's keep the release notes short and friendly.",
    "The certificate on the public API expires next month.",
    "Somebody left the coffee machine running all night.",
    "Please double the memory limit for the worker pods.",
    "The quarterly report is due on the fifteenth.",
    "I can hear an echo when you unmute your microphone.",
    "Thanks everyone, that was a really productive session.",
)
VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-us+f3", "en-029+m4", "en-gb-x-rp+f2", "en-us-nyc")
SILENCE_FLOOR = 32768 * 10 ** (-60 / 20)  # RMS below -60 dBFS: espeak's leading/trailing digital silence
PAUSE_FRAMES = 35  # 700 ms between sentences: longer than the 500 ms silence window, so turns end
NOISE_DBFS = -50.0  # the pause is quiet room noise, above Silero's -60 dBFS floor: still decoded and scored


def spoken(index: int) -> tuple[bytes, ...]:
    """Speaker `index`'s sentence as 48 kHz stereo 20 ms frames, digital silence trimmed from both ends."""
    frames = speech_frames(SENTENCES[index % len(SENTENCES)], voice=VOICES[index % len(VOICES)],
                           speed=160 + 5 * (index % 5))
    loud = [i for i, f in enumerate(frames)
            if np.sqrt(np.mean(np.frombuffer(f, dtype="<i2").astype(np.float64) ** 2)) >= SILENCE_FLOOR]
    return frames[loud[0]:loud[-1] + 1]


def talking(index: int) -> list[bytes]:
    """Speaker `index` talking on and on: their sentence, then 700 ms of quiet room noise (a client that
    keeps sending), as 48 kHz stereo 20 ms frames to loop."""
    noise = np.random.default_rng(index).standard_normal(960 * PAUSE_FRAMES) * 32768 * 10 ** (NOISE_DBFS / 20)
    quiet = np.repeat(np.clip(np.rint(noise), -32768, 32767).astype("<i2"), 2).tobytes()
    return list(spoken(index)) + [quiet[i * 3840:(i + 1) * 3840] for i in range(PAUSE_FRAMES)]


class Speaker:
    """One person in the call: their Opus frames and a DAVE + transport sender."""

    def __init__(self, index: int, key: list[int], session: object, loop_frames: int, offset: int) -> None:
        self.index = index
        self.user_id = USER0 + index
        self.ssrc = SSRC0 + index
        self.text = SENTENCES[index % len(SENTENCES)]
        self.voice = VOICES[index % len(VOICES)]
        encoder = discord.opus.Encoder()
        self.sentence_opus = [encoder.encode(f, 960) for f in spoken(index)]  # said once (endpointing)
        pcm = talking(index)
        encoder = discord.opus.Encoder()  # looped from a per-speaker offset (CPU)
        self.opus = [encoder.encode(pcm[(offset + i) % len(pcm)], 960) for i in range(loop_frames)]
        self.sender = DiscordSender(self.ssrc, key, session)


def make_core(answers_to: str = "everyone") -> CallCore:
    """A started local-endpointing call core, as the bot builds one for a room."""
    provider = OpenAIRealtime("k", "gpt-realtime-2.1-mini", "marin")
    session = SessionConfig("be brief", "marin", (ToolSpec("t", "d", {"type": "object", "properties": {}}),))
    options = CallOptions(endpointing="local", vad=VadConfig(), reply_to=answers_to,
                          min_interruption_ms=MIN_INTERRUPTION_MS)
    core = CallCore(provider, session, options)
    core.start(0.0)
    return core


def make_receiver(conn: FakeConnection, speakers: list[Speaker], on_audio) -> Receiver:
    rx = Receiver(conn, on_audio, pcm_rate=24_000, pcm_channels=1)  # as a call's receiver: the model's format
    for s in speakers:
        rx.on_ws_message({"op": 5, "d": {"user_id": str(s.user_id), "ssrc": s.ssrc, "speaking": 1}})
    return rx


class ProviderAnswers:
    """The provider's side of one call on the core's virtual clock, without a socket.

    Every input_audio_buffer.commit is acknowledged (input_audio_buffer.committed); every
    response.create gets response.created at once and response.done `answer_ms` later; a
    response.cancel ends the active response at once (status cancelled)."""

    def __init__(self, core: CallCore, answer_ms: float) -> None:
        self.core = core
        self.answer_s = answer_ms / 1000
        self._ids = itertools.count(1)
        self.due: list[tuple[float, str]] = []
        self.active: str | None = None
        self.created = self.cancelled = 0

    def carry(self, actions: list, now: float) -> list:
        """The core's actions plus everything the provider's answers to them made the core do."""
        out = list(actions)
        at = 0
        while at < len(out):
            action = out[at]
            at += 1
            if not isinstance(action, Send):
                continue
            kind = action.event["type"]
            if kind == "input_audio_buffer.commit":
                out += self.core.on_provider(ev.InputCommitted(f"item_{next(self._ids)}"), now, POSITION)
            elif kind == "response.create":
                rid = f"resp_{next(self._ids)}"
                self.active = rid
                self.created += 1
                self.due.append((now + self.answer_s, rid))
                metadata = action.event.get("response", {}).get("metadata", {})
                out += self.core.on_provider(ev.ResponseCreated(rid, metadata), now, POSITION)
            elif kind == "response.cancel" and self.active is not None:
                rid, self.active = self.active, None
                self.due = [(t, r) for t, r in self.due if r != rid]
                self.cancelled += 1
                out += self.core.on_provider(ev.ResponseDone(rid, "cancelled"), now, POSITION)
        return out

    def tick(self, now: float) -> list:
        """Finish every answer that is due."""
        out: list = []
        while self.due and self.due[0][0] <= now + 1e-9:
            _, rid = self.due.pop(0)
            if self.active == rid:
                self.active = None
            out += self.carry(self.core.on_provider(ev.ResponseDone(rid, "completed"), now, POSITION), now)
        return out


def sent_types(actions: list) -> list[str]:
    return [a.event["type"] for a in actions if isinstance(a, Send)]


# -- 1. CPU per speaker ------------------------------------------------------------------------------


class Setup:
    """Everything one N needs, kept across rounds so every stream stays continuous."""

    STAGES = ("receive", "resample", "vad", "turns")

    def __init__(self, n: int, speakers: list[Speaker], conn: FakeConnection, lib: ctypes.CDLL,
                 bank: SileroBank, answer_ms: float) -> None:
        self.n, self.speakers = n, speakers[:n]
        self.lib = lib
        err = ctypes.c_int()
        self.raw_states = [lib.opus_decoder_create(48_000, 2, ctypes.byref(err)) for _ in self.speakers]
        self.raw_buf = (ctypes.c_int16 * (5760 * 2))()
        self.room = RoomTransport(names=lambda uid: f"user{uid % 1000}", vad=bank, clock=lambda: 0.0)
        self.delivered: list[tuple[int, int, bytes]] = []
        self.rx = make_receiver(conn, self.speakers, lambda u, s, p: self.delivered.append((u, s, p)))
        self.core = make_core()
        self.answers = ProviderAnswers(self.core, answer_ms)
        self.now = 0.0
        self.at = 0  # next loop frame
        self.results: dict[str, list[float]] = {}
        self.commits = self.voiced = self.heard = 0

    def record(self, name: str, value: float) -> None:
        self.results.setdefault(name, []).append(value)

    def frames(self, ticks: int) -> list[list[bytes]]:
        span = len(self.speakers[0].opus)
        return [[s.opus[(self.at + t) % span] for s in self.speakers] for t in range(ticks)]

    def packets(self, frames: list[list[bytes]]) -> list[list[bytes]]:
        """Fresh packets, tick-major, in the order they will be consumed (untimed)."""
        return [[s.sender.packet(f) for s, f in zip(self.speakers, tick, strict=True)] for tick in frames]

    def run_raw(self, frames: list[list[bytes]]) -> float:
        decode, buf, states = self.lib.opus_decode, self.raw_buf, self.raw_states
        t = clock()
        for tick in frames:
            for st, f in zip(states, tick, strict=True):
                decode(st, f, len(f), buf, 5760, 0)
        return clock() - t

    def run_whole(self, packets: list[list[bytes]]) -> tuple[float, dict[str, float]]:
        on_packet, on_speech, room_tick = self.rx.on_packet, self.room.on_speech, self.room.tick
        on_room_audio, carry, answer_tick = self.core.on_room_audio, self.answers.carry, self.answers.tick
        delivered = self.delivered
        spent = dict.fromkeys(self.STAGES, 0.0)
        now = self.now
        commits = voiced = heard = 0
        for batch in packets:
            t0 = clock()
            for p in batch:
                on_packet(p)
            t1 = clock()
            for u, s, pcm in delivered:
                on_speech(u, s, pcm)
            delivered.clear()
            t2 = clock()
            tick = room_tick()
            t3 = clock()
            actions = carry(on_room_audio(tick, now, POSITION), now) + answer_tick(now)
            t4 = clock()
            spent["receive"] += t1 - t0
            spent["resample"] += t2 - t1
            spent["vad"] += t3 - t2
            spent["turns"] += t4 - t3
            commits += sent_types(actions).count("input_audio_buffer.commit")
            heard += len(tick.frames)
            voiced += sum(f.probability >= 0.5 for f in tick.frames.values())
            now += TICK_S
        whole = sum(spent.values())  # the four stages back to back; the bench's own bookkeeping left out
        self.now = now
        self.at += len(packets)
        self.commits += commits
        self.voiced += voiced
        self.heard += heard
        return whole, spent


def cpu_section(args: argparse.Namespace, rng: random.Random, bank: SileroBank) -> tuple[dict[int, Setup], float]:
    ticks = max(25, int(round(args.seconds / TICK_S)))
    group = DaveGroup(CHANNEL)
    bot = group.join(BOT)
    key = [rng.randrange(256) for _ in range(32)]
    conn = FakeConnection(list(key), ssrc=1, dave_session=bot, dave_protocol_version=1)
    top = max(COUNTS)
    sessions = [group.join(USER0 + i) for i in range(top)]
    loop_frames = ticks * args.rounds
    speakers = [Speaker(i, key, sessions[i], loop_frames, rng.randrange(100)) for i in range(top)]
    lib = load_libopus()
    setups = {n: Setup(n, speakers, conn, lib, bank, args.answer_ms) for n in COUNTS}
    for r in range(args.rounds):
        order = COUNTS[r % len(COUNTS):] + COUNTS[:r % len(COUNTS)]
        for n in order:
            s = setups[n]
            frames = s.frames(ticks)
            raw = s.run_raw(frames)
            whole, stages = s.run_whole(s.packets(frames))
            s.record("raw_s", raw)
            s.record("whole", whole / raw)
            for name, value in stages.items():
                s.record(name, value / raw)
    for s in setups.values():
        expected = args.rounds * ticks * s.n
        assert s.rx.stats["ok"] == expected, (s.rx.stats["ok"], expected, s.rx.nonzero_stats())
    return setups, ticks * TICK_S


def print_cpu(setups: dict[int, Setup], seconds: float, rounds: int, answer_ms: float) -> None:
    med = statistics.median
    print(f"== 1. CPU per speaker: N people sending at once, all along (sentence + 700 ms quiet noise, looped); "
          f"{rounds} rounds x {seconds:g} s per speaker; DAVE + aead_xchacha20_poly1305_rtpsize; espeak-ng, "
          f"{len(SENTENCES)} sentences, {len(VOICES)} voices")
    print("   each figure = median over rounds of CPU (time.process_time) for the N speakers' audio / raw libopus "
          "decode CPU of the same Opus frames in the same round (so: per speaker)")
    print("   whole = receive + resample + vad + turns: Receiver.on_packet, RoomTransport.on_speech, "
          "RoomTransport.tick (shared SileroBank, one batched run per tick), CallCore.on_room_audio")
    print(f"   provider answers on virtual time: response.done {answer_ms:g} ms after response.create")
    wholes = {n: med(s.results["whole"]) for n, s in setups.items()}
    top = max(COUNTS)
    print(f"ratio: {wholes[top]:.3f}  (whole path / raw libopus decode, {top} speakers)")
    header = (f"{'N':>3} {'raw us/frame':>12} {'whole':>7} " + " ".join(f"{k:>8}" for k in Setup.STAGES)
              + f" {'us/spk/tick':>11} {'turns':>5} {'voiced':>6}")
    print(header)
    for n, s in setups.items():
        raw_us = med(s.results["raw_s"]) * 1e6 / (n * s.at / rounds)
        whole_us = wholes[n] * raw_us
        print(f"{n:>3} {raw_us:>12.1f} {wholes[n]:>7.3f} "
              + " ".join(f"{med(s.results[k]):>8.3f}" for k in Setup.STAGES)
              + f" {whole_us:>11.1f} {s.commits:>5} {100 * s.voiced / max(1, s.heard):>5.0f}%")
    values = list(wholes.values())
    mean = sum(values) / len(values)
    deviation = max(abs(v - mean) / mean for v in values)
    spread = max(values) / min(values)
    print("   columns: raw = baseline decode per frame; whole and stages = ratios to it; us/spk/tick = whole "
          "path CPU per speaker per 20 ms tick; turns = commits over all rounds; voiced = ticks Silero scored >= 0.5")
    print(f"spread over N: max/min = {spread:.3f}; largest deviation from the mean = {100 * deviation:.1f}%")
    # the goal is both: cheap enough at the top, and flat in N; each is its own line, met or missed
    goal("discord_call", f"whole / raw decode at {top} speakers {wholes[top]:.3f}", f"<= {GOAL_RATIO:.1f}",
         wholes[top] <= GOAL_RATIO)
    goal("discord_call", f"whole over N: largest deviation from the mean {100 * deviation:.1f}%",
         f"flat, within +-{100 * FLAT:.0f}%", deviation <= FLAT)
    big = setups[top]
    print(f"   receiver stats (N={top}): {big.rx.nonzero_stats()}; room frames shed: {big.room.frames_shed}")


# -- 2. endpointing -------------------------------------------------------------------------------------


def endpointing_run(speakers: list[Speaker], starts: list[int], conn: FakeConnection, bank: SileroBank,
                    answer_ms: float) -> list[dict]:
    """Each speaker says their sentence once from tick `starts[i]`; the call runs until every one of
    them is committed. Per speaker: ms from last packet to turn ended, and to commit."""
    room = RoomTransport(vad=bank, clock=lambda: 0.0)
    core = make_core()
    answers = ProviderAnswers(core, answer_ms)
    rx = make_receiver(conn, speakers, room.on_speech)
    packets = [[s.sender.packet(f) for f in s.sentence_opus] for s in speakers]  # untimed
    last = {s.user_id: start + len(p) - 1 for s, start, p in zip(speakers, starts, packets, strict=True)}
    latest: dict[int, object] = {}  # user -> their latest utterance
    target: dict[int, object] = {}  # user -> the utterance holding their last packet
    committed: dict[int, float] = {}
    end = max(last.values()) + 50 * len(speakers) * (2 + int(answer_ms / 1000)) + 100
    tick = 0
    while len(committed) < len(speakers) and tick < end:
        for start, p in zip(starts, packets, strict=True):
            if start <= tick < start + len(p):
                rx.on_packet(p[tick - start])
        now = tick * TICK_S
        actions = answers.carry(core.on_room_audio(room.tick(), now, POSITION), now) + answers.tick(now)
        queue = core.speakers.queue
        for utterance in queue:
            latest[utterance.user_id] = utterance
        for s in speakers:
            if tick == last[s.user_id]:
                target[s.user_id] = core.speakers.speaking.get(s.user_id) or latest.get(s.user_id)
        if "input_audio_buffer.commit" in sent_types(actions):
            for user, utterance in target.items():
                if user not in committed and utterance is not None and utterance not in queue:
                    committed[user] = now
        tick += 1
    assert rx.stats["ok"] == sum(len(p) for p in packets), rx.nonzero_stats()
    out = []
    for s in speakers:
        u = target.get(s.user_id)
        last_ms = last[s.user_id] * TICK_S * 1000
        ended = getattr(u, "ended_at", None)
        commit = committed.get(s.user_id)
        out.append({"speech_ms": len(s.sentence_opus) * 20,
                    "ended_ms": None if ended is None else ended * 1000 - last_ms,
                    "queue_ms": None if ended is None or commit is None else (commit - ended) * 1000,
                    "commit_ms": None if commit is None else commit * 1000 - last_ms})
    return out


def endpointing_section(args: argparse.Namespace, rng: random.Random, bank: SileroBank) -> dict[str, list[dict]]:
    group = DaveGroup(CHANNEL + 1)
    bot = group.join(BOT)
    key = [rng.randrange(256) for _ in range(32)]
    conn = FakeConnection(list(key), ssrc=1, dave_session=bot, dave_protocol_version=1)
    pool = 10 if args.quick else 20
    speakers = [Speaker(i, key, group.join(USER0 + i), 1, 0) for i in range(pool)]
    lead = 10  # 200 ms before anyone speaks
    alone: list[dict] = []
    for s in speakers[:10]:
        alone += endpointing_run([s], [lead], conn, bank, args.answer_ms)
    together: list[dict] = []
    sets = 1 if args.quick else 3
    for _ in range(sets):
        chosen = rng.sample(speakers, 10)
        starts = [lead + rng.randrange(16) for _ in chosen]  # within 300 ms of each other
        together += endpointing_run(chosen, starts, conn, bank, args.answer_ms)
    return {"1 speaker": alone, "10 at once": together}


def print_endpointing(results: dict[str, list[dict]], answer_ms: float) -> None:
    silence = VadConfig().silence_ms
    limit_ms = silence + 25
    print(f"\n== 2. endpointing per speaker (core virtual time, 20 ms ticks; silence window {silence} ms; "
          f"provider answer done {answer_ms:g} ms after response.create)")
    print("   turn ended = the VAD's end of that speaker's utterance (ready to commit); queue wait = ready -> "
          "their input_audio_buffer.commit (waits for the answers to earlier turns)")
    print(f"{'scenario':<11} {'n':>3}  {'last pkt->turn ended med/max':>28}  {'queue wait med/max':>20}  "
          f"{'last pkt->commit med/max':>25}  {'ended - silence':>15}")
    for name, rows in results.items():
        ended, queue, commit = ([r[key] for r in rows if r[key] is not None]
                                for key in ("ended_ms", "queue_ms", "commit_ms"))
        missing = len(rows) - len(commit)
        med = statistics.median
        print(f"{name:<11} {len(rows):>3}  {med(ended):>16.0f} / {max(ended):>5.0f} ms  "
              f"{med(queue):>9.0f} / {max(queue):>5.0f} ms  {med(commit):>13.0f} / {max(commit):>5.0f} ms  "
              f"{med(ended) - silence:>+12.0f} ms" + (f"  ({missing} never committed)" if missing else ""))
    ended_all = [r["ended_ms"] for rows in results.values() for r in rows if r["ended_ms"] is not None]
    single = [r["ended_ms"] for r in results["1 speaker"] if r["ended_ms"] is not None]
    crowd = [r["ended_ms"] for r in results["10 at once"] if r["ended_ms"] is not None]
    print(f"all speakers: last packet -> turn ended min {min(ended_all):.0f} ms")
    alone, together = statistics.median(single), statistics.median(crowd)
    goal("discord_call", f"median last packet -> turn ended {alone:.0f} ms alone, {together:.0f} ms with 10",
         f"<= {limit_ms} ms at both", alone <= limit_ms and together <= limit_ms)


# -- 3. addressed mode: the transcription wait ---------------------------------------------------------


class RecordingConnection:
    """The engine's websocket, stamping (perf_counter) each client event as it is sent and each
    server event as it arrives, by type."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.sent: list[tuple[float, str]] = []
        self.received: list[tuple[float, str]] = []

    async def send(self, message: str) -> None:
        await self.ws.send(message)
        self.sent.append((time.perf_counter(), json.loads(message)["type"]))

    async def __aiter__(self):
        async for message in self.ws:
            self.received.append((time.perf_counter(), json.loads(message).get("type", "")))
            yield message

    async def close(self) -> None:
        await self.ws.close()


QUIET_TICKS = 35  # 700 ms where nobody sends anything: the VAD's 500 ms window ends the turn inside it


def speech_ticks(bank: SileroBank, user_id: int, index: int) -> list[RoomTick]:
    """One speaker's sentence as RoomTicks (24 kHz frames with Silero probabilities)."""
    stereo = np.frombuffer(b"".join(spoken(index)), dtype="<i2").reshape(-1, 2)
    mono = to_mono_24k(stereo, 48_000)
    stream = bank.stream()
    ticks = []
    for i in range(0, len(mono) - 959, 960):
        frame = mono[i:i + 960]
        stream.push(frame)
        while stream.pending:
            bank.run((stream,))
        ticks.append(RoomTick({user_id: HeardFrame(frame, stream.last)}))
    return ticks


async def caught_up(engine: CallEngine, fake: FakeRealtime) -> None:
    """Until the fake has received every event the engine sent, and nothing more comes for 40 ms."""
    seen = -1
    while seen != len(fake.received) or engine.sent_events != len(fake.received):
        seen = len(fake.received)
        await asyncio.sleep(0.04)


async def transcript_wait(bank: SileroBank, delay_ms: int, turns: int, mode: str) -> dict[str, list[float]]:
    """Per turn, ms from input_audio_buffer.commit sent to response.create sent ("wait"), split into
    commit sent -> its transcription received ("provider") and transcription received ->
    response.create sent ("engine")."""
    users = [USER0 + i for i in range(3)]
    texts = {u: [f"Ares, {SENTENCES[(i + k) % len(SENTENCES)].lower()}" for k in range(turns)]
             for i, u in enumerate(users)}
    spoken_ticks = {u: speech_ticks(bank, u, i) for i, u in enumerate(users)}
    recorders: list[RecordingConnection] = []

    async def connector(url: str, headers: dict[str, str]):
        from websockets.asyncio.client import connect
        ws = RecordingConnection(await connect(url, additional_headers=headers))
        recorders.append(ws)
        return ws

    async with FakeRealtime(default_reply=AudioReply("Okay.", audio_ms=200), transcripts=texts,
                            transcript_delay_ms=delay_ms) as fake:
        transport = VirtualTransport()
        provider = OpenAIRealtime("bench", "gpt-realtime-2.1-mini", "marin", url=fake.url)
        options = CallOptions(endpointing="local", reply_to=mode, min_interruption_ms=MIN_INTERRUPTION_MS,
                              addressed=functools.partial(addresses_agent, agent_name="Ares"), followup_s=0.0)
        engine = CallEngine(provider, transport, ToolCatalogue(), Identity("bench"), options=options,
                            connector=connector, vad_name="silero", clock=time.perf_counter)
        task = asyncio.create_task(engine.run())
        try:
            for k in range(turns):
                user = users[k % len(users)]
                responses = fake.response_count
                for tick in spoken_ticks[user]:  # the speech at once: only the turn's end is timed
                    transport.push_tick(tick)
                await caught_up(engine, fake)  # the fake has checked every append: no backlog ahead of the commit
                for _ in range(QUIET_TICKS):  # the silence that ends the turn, in real time
                    transport.push_tick(RoomTick({}))
                    await asyncio.sleep(TICK_S)
                await fake.wait_for(lambda r=responses: fake.response_count > r and engine.core.idle()
                                    and not transport.is_playing(), timeout=20)
        finally:
            engine.stop()
            await task
        fake.assert_clean()
    ws = recorders[0]
    commits = [t for t, kind in ws.sent if kind == "input_audio_buffer.commit"]
    creates = [t for t, kind in ws.sent if kind == "response.create"]
    heard = [t for t, kind in ws.received if kind == "conversation.item.input_audio_transcription.completed"]
    assert len(commits) == len(creates) == turns, (len(commits), len(creates))
    out = {"wait": [(b - a) * 1000 for a, b in zip(commits, creates, strict=True)]}
    if mode == "addressed":
        assert len(heard) == turns, len(heard)
        out["provider"] = [(b - a) * 1000 for a, b in zip(commits, heard, strict=True)]
        out["engine"] = [(b - a) * 1000 for a, b in zip(heard, creates, strict=True)]
    return out


def addressed_section(args: argparse.Namespace, bank: SileroBank) -> list[tuple[str, int, dict[str, list[float]]]]:
    turns = 4 if args.quick else 10
    rows = [("everyone", 0, asyncio.run(transcript_wait(bank, 0, turns, "everyone")))]
    for delay in (0, 300):
        rows.append(("addressed", delay, asyncio.run(transcript_wait(bank, delay, turns, "addressed"))))
    return rows


def print_addressed(rows: list[tuple[str, int, dict[str, list[float]]]]) -> None:
    med = statistics.median
    print("\n== 3. addressed mode: input_audio_buffer.commit sent -> response.create sent (real time, stamped on "
          "the engine's websocket; fake Realtime server on loopback in this process)")
    print("   provider = commit sent -> its transcription received (the fake's delay, its schema checks, loopback); "
          "engine = transcription received -> response.create sent")
    print(f"{'mode':<10} {'transcript delay':>16} {'turns':>5} {'wait med/max':>19} {'wait - delay':>13} "
          f"{'provider med':>13} {'engine med/max':>17}")
    for mode, delay, values in rows:
        wait = values["wait"]
        line = (f"{mode:<10} {delay:>13} ms {len(wait):>5} {med(wait):>7.1f} / {max(wait):>6.1f} ms "
                f"{med(wait) - delay:>+10.1f} ms")
        if "engine" in values:
            line += (f" {med(values['provider']):>10.1f} ms {med(values['engine']):>6.2f} / "
                     f"{max(values['engine']):>5.2f} ms")
        print(line)
    print(f"   baseline: everyone mode (no transcription wait), median {med(rows[0][2]['wait']):.2f} ms; addressed "
          "tracks the transcript delay plus the provider-side overhead; the engine's own share is the last column")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=2.0, help="speech per speaker per round")
    parser.add_argument("--answer-ms", type=float, default=1000.0,
                        help="the provider's answer completes this long after response.create")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="3 rounds x 1 s, fewer endpointing runs and turns")
    parser.add_argument("--skip", default="", help="comma list of sections to skip: cpu,endpointing,addressed")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 3, 1.0
    skip = set(filter(None, args.skip.split(",")))
    logging.basicConfig(level=logging.WARNING)
    rng = random.Random(args.seed)
    np.random.seed(args.seed)
    wall = time.perf_counter()
    bank = SileroBank()  # one per process, as the bot has
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start")
    if "cpu" not in skip:
        setups, seconds = cpu_section(args, rng, bank)
        print_cpu(setups, seconds, args.rounds, args.answer_ms)
    if "endpointing" not in skip:
        print_endpointing(endpointing_section(args, rng, bank), args.answer_ms)
    if "addressed" not in skip:
        print_addressed(addressed_section(args, bank))
    load = os.getloadavg()
    print(f"\ntotal wall {time.perf_counter() - wall:.1f} s; load average {load[0]:.2f} at the end")


if __name__ == "__main__":
    main()
