"""Discord call path benchmark: CPU per second of speech per speaker, 1 / 5 / 25 people talking at once.

Every speaker has their own SSRC and DAVE sender (all in one DaveGroup with the bot) and says an
espeak-ng sentence (text and voice vary per speaker) looped to --seconds. One 20 ms tick is:

  whole path: every speaker's packet -> Receiver.on_packet (transport decrypt + DAVE decrypt + Opus
      decode) -> RoomTransport.on_speech (downmix + 48->24 kHz resample + queue) -> one
      RoomTransport.frames() tick (mix() + TurnContext) -> CallCore.on_user_audio (local
      endpointing) with SileroDetector. The VAD runs once per tick on the MIXED stream, not per
      speaker (that is the design), so its cost per speaker shrinks as N grows.
  stages, on the same Opus frames (fresh packets): crypto+decode (Receiver, PCM into a list),
      resample (on_speech), mix (frames() tick), vad (SileroDetector.probability on the mixed frames),
      engine (CallCore.on_user_audio with a stub detector replaying the vad stage's probabilities,
      so turns start and end as in the whole path but the model is not counted twice).
  baseline: raw libopus, one ctypes opus_decode per frame into a reused buffer (as bench/receive.py),
      of exactly the Opus frames inside that round's packets, one decoder state per speaker.

Each figure is CPU time (time.process_time: this process, all threads, so other load on the machine
does not count) divided by the baseline's CPU time for the same N in the same round; the medians of
those per-round ratios are printed. Rounds are interleaved (per round, per N: baseline, whole,
stages; the N order rotates each round). DAVE rejects replayed frames, so every pass that goes
through a Receiver gets freshly built packets (untimed), built in exactly the order they are consumed.

Endpointing delay: one speaker says a sentence once, then sends nothing (as Discord clients do in
silence, so the room yields digital-silence frames); reported as stream time from the tick of the
speaker's LAST PACKET (espeak's quiet tail included: "last voiced packet" = last packet sent) to the
tick whose on_user_audio returns input_audio_buffer.commit.

Seeded (--seed): transport key, loop offsets. DAVE/MLS key material comes from the OS inside davey.
Run: .venv/bin/python bench/discord_call.py [--rounds N] [--seconds S] [--seed N]
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import discord.opus  # noqa: E402
import numpy as np  # noqa: E402

from tests.support.dave_group import DaveGroup  # noqa: E402
from tests.support.packets import DiscordSender, FakeConnection  # noqa: E402
from tests.support.speech import speech_frames  # noqa: E402
from voice.call.actions import PlaybackPosition, Send  # noqa: E402
from voice.call.core import CallCore, CallOptions  # noqa: E402
from voice.call.providers import OpenAIRealtime, SessionConfig, ToolSpec  # noqa: E402
from voice.call.silero_vad import SileroDetector  # noqa: E402
from voice.call.vad import VadConfig  # noqa: E402
from voice.media.opus import load_libopus  # noqa: E402
from voice.media.receive import Receiver  # noqa: E402
from voice.media.room import RoomTransport  # noqa: E402

CHANNEL, BOT = 1_300_000_000_000_000_001, 3_000_000_000_000_000_001
USER0, SSRC0 = 3_000_000_000_000_000_100, 5000
COUNTS = (1, 5, 25)
TICK_S = 0.02
CHUNK_TICKS = 50  # the resample/mix stages alternate in 1 s chunks so room queues never overflow
GOAL_RATIO = 3.0
POSITION = PlaybackPosition()  # the bot is not playing anything
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
)
VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-us+f3", "en-029+m4", "en-gb-x-rp+f2", "en-us-nyc")


class Speaker:
    """One person in the call: their looped Opus frames and a DAVE + transport sender."""

    def __init__(self, index: int, key: list[int], session: object, ticks: int, offset: int) -> None:
        self.user_id = USER0 + index
        self.ssrc = SSRC0 + index
        self.text = SENTENCES[index % len(SENTENCES)]
        self.voice = VOICES[index % len(VOICES)]
        pcm = speech_frames(self.text, voice=self.voice, speed=160 + 5 * (index % 5))
        self.sentence_pcm = pcm
        encoder = discord.opus.Encoder()
        self.opus = [encoder.encode(pcm[(offset + i) % len(pcm)], 960) for i in range(ticks)]
        encoder = discord.opus.Encoder()
        self.sentence_opus = [encoder.encode(f, 960) for f in pcm]
        self.sender = DiscordSender(self.ssrc, key, session)


class ReplayDetector:
    """Stub SpeechDetector for the engine stage: replays probabilities the vad stage computed."""

    name = "replay"

    def __init__(self) -> None:
        self.script: list[float] = []
        self.at = 0

    def probability(self, frame: bytes) -> float:
        p = self.script[self.at]
        self.at += 1
        return p


class TimedDetector:
    """SileroDetector timed from inside the whole path (two clock reads per tick), to show what the
    model costs there, interleaved with everyone's receive work, against the isolated vad stage."""

    name = "silero"

    def __init__(self) -> None:
        self.inner = SileroDetector()
        self.spent = 0.0

    def probability(self, frame: bytes) -> float:
        t = clock()
        p = self.inner.probability(frame)
        self.spent += clock() - t
        return p


class RecordingDetector:
    """SileroDetector that remembers each frame's probability (for the endpointing report)."""

    name = "silero"

    def __init__(self) -> None:
        self.inner = SileroDetector()
        self.seen: list[float] = []

    def probability(self, frame: bytes) -> float:
        p = self.inner.probability(frame)
        self.seen.append(p)
        return p


def make_core(detector: object) -> CallCore:
    """A local-endpointing call core as tests/test_call_core.py builds one, started."""
    provider = OpenAIRealtime("k", "gpt-realtime-2.1-mini", "marin")
    session = SessionConfig("be brief", "marin", (ToolSpec("t", "d", {"type": "object", "properties": {}}),))
    core = CallCore(provider, session, CallOptions(endpointing="local"), detector=detector)
    core.start(0.0)
    return core


def make_room() -> tuple[RoomTransport, object]:
    """A room and a function returning its next frames() tick (driven by hand, no event loop)."""

    async def no_sleep(_delay: float) -> None:
        return None

    room = RoomTransport(names=lambda uid: f"user{uid % 1000}", clock=lambda: 0.0, sleep=no_sleep)
    agen = room.frames()

    def next_frame() -> bytes:
        try:
            agen.__anext__().send(None)
        except StopIteration as stop:
            return stop.value
        raise RuntimeError("frames() suspended")

    return room, next_frame


def make_receiver(conn: FakeConnection, speakers: list[Speaker], on_audio) -> Receiver:
    rx = Receiver(conn, on_audio)
    for s in speakers:
        rx.on_ws_message({"op": 5, "d": {"user_id": str(s.user_id), "ssrc": s.ssrc, "speaking": 1}})
    return rx


def build_packets(speakers: list[Speaker], ticks: int) -> list[list[bytes]]:
    """Fresh packets, tick-major, in the order they will be consumed."""
    return [[s.sender.packet(s.opus[t]) for s in speakers] for t in range(ticks)]


def is_commit(actions: list) -> bool:
    return any(isinstance(a, Send) and a.event.get("type") == "input_audio_buffer.commit" for a in actions)


class Setup:
    """Everything one N needs, kept across rounds so every stream stays continuous."""

    def __init__(self, n: int, speakers: list[Speaker], conn: FakeConnection, lib: ctypes.CDLL) -> None:
        self.n, self.speakers = n, speakers[:n]
        self.lib = lib
        err = ctypes.c_int()
        self.raw_states = [lib.opus_decoder_create(48_000, 2, ctypes.byref(err)) for _ in self.speakers]
        self.raw_buf = (ctypes.c_int16 * (5760 * 2))()
        # whole path
        self.room_w, self.tick_w = make_room()
        self.vad_w = TimedDetector()
        self.core_w = make_core(self.vad_w)
        self.rx_w = make_receiver(conn, self.speakers, self.room_w.on_speech)
        # stages
        self.delivered: list[tuple[int, int, bytes]] = []
        self.rx_s = make_receiver(conn, self.speakers, lambda u, s, p: self.delivered.append((u, s, p)))
        self.room_s, self.tick_s = make_room()
        self.vad_s = SileroDetector()
        self.replay = ReplayDetector()
        self.core_s = make_core(self.replay)
        self.now = 0.0
        self.results: dict[str, list[float]] = {}
        self.commits = 0  # whole path
        self.stage_commits = 0
        self.ticks = self.voiced_ticks = self.clipped = self.samples = 0

    def record(self, name: str, value: float) -> None:
        self.results.setdefault(name, []).append(value)

    def run_raw(self, ticks: int) -> float:
        decode, buf = self.lib.opus_decode, self.raw_buf
        pairs = [(st, s.opus) for st, s in zip(self.raw_states, self.speakers, strict=True)]
        t = clock()
        for i in range(ticks):
            for st, frames in pairs:
                f = frames[i]
                decode(st, f, len(f), buf, 5760, 0)
        return clock() - t

    def run_whole(self, packets: list[list[bytes]]) -> float:
        on_packet, next_frame = self.rx_w.on_packet, self.tick_w
        on_user_audio, turn_context = self.core_w.on_user_audio, self.room_w.turn_context
        now = self.now
        commits = 0
        t = clock()
        for batch in packets:
            for p in batch:
                on_packet(p)
            frame = next_frame()
            if is_commit(on_user_audio(frame, now, POSITION, turn_context())):
                commits += 1
            now += TICK_S
        elapsed = clock() - t
        self.commits += commits
        return elapsed

    def run_stages(self, packets: list[list[bytes]]) -> dict[str, float]:
        out = dict.fromkeys(("crypto", "resample", "mix", "vad", "engine"), 0.0)
        self.delivered.clear()
        on_packet = self.rx_s.on_packet
        t = clock()
        for batch in packets:
            for p in batch:
                on_packet(p)
        out["crypto"] = clock() - t
        delivered, n = self.delivered, self.n
        assert len(delivered) == n * len(packets), (len(delivered), self.rx_s.nonzero_stats())
        on_speech, next_frame, turn_context = self.room_s.on_speech, self.tick_s, self.room_s.turn_context
        mixed: list[tuple[bytes, object]] = []
        for c in range(0, len(packets), CHUNK_TICKS):
            ticks = min(CHUNK_TICKS, len(packets) - c)
            chunk = delivered[c * n:(c + ticks) * n]
            t = clock()
            for u, s, p in chunk:
                on_speech(u, s, p)
            t1 = clock()
            for _ in range(ticks):
                mixed.append((next_frame(), turn_context()))
            out["resample"] += t1 - t
            out["mix"] += clock() - t1
        probability = self.vad_s.probability
        t = clock()
        probs = [probability(frame) for frame, _ in mixed]
        out["vad"] = clock() - t
        self.replay.script, self.replay.at = probs, 0
        on_user_audio, now = self.core_s.on_user_audio, self.now
        t = clock()
        for frame, context in mixed:
            if is_commit(on_user_audio(frame, now, POSITION, context)):
                self.stage_commits += 1
            now += TICK_S
        out["engine"] = clock() - t
        self.now = now
        threshold = VadConfig().speech_threshold  # untimed: what the VAD and the mix looked like
        self.ticks += len(probs)
        self.voiced_ticks += sum(p >= threshold for p in probs)
        for frame, _ in mixed:
            samples = np.frombuffer(frame, dtype="<i2")
            self.clipped += int(np.count_nonzero((samples == 32767) | (samples == -32768)))
            self.samples += samples.size
        return out


def endpointing_delay(speaker: Speaker, conn: FakeConnection, silence_ticks: int) -> dict[str, float]:
    """One sentence, then nothing; ms from the last packet's tick to the commit's tick."""
    room, next_frame = make_room()
    detector = RecordingDetector()
    core = make_core(detector)
    rx = make_receiver(conn, [speaker], room.on_speech)
    lead = 10  # 200 ms of silence before the speaker starts
    packets = [speaker.sender.packet(f) for f in speaker.sentence_opus]
    last_packet = lead + len(packets) - 1
    commit_tick = None
    for tick in range(lead + len(packets) + silence_ticks):
        if lead <= tick <= last_packet:
            rx.on_packet(packets[tick - lead])
        actions = core.on_user_audio(next_frame(), tick * TICK_S, POSITION, room.turn_context())
        if is_commit(actions):
            commit_tick = tick
            break
    release = VadConfig().release_threshold
    voiced = [i for i, p in enumerate(detector.seen) if p >= release]
    return {
        "frames": len(packets),
        "commit_ms": None if commit_tick is None else (commit_tick - last_packet) * 20.0,
        "from_voiced_ms": None if commit_tick is None or not voiced else (commit_tick - voiced[-1]) * 20.0,
        "tail_ms": (last_packet - voiced[-1]) * 20.0 if voiced else None,
    }


def med(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seconds", type=float, default=3.0, help="speech per speaker per round")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rounds, ticks = args.rounds, max(CHUNK_TICKS, int(round(args.seconds / TICK_S)))
    seconds = ticks * TICK_S
    rng = random.Random(args.seed)
    np.random.seed(args.seed)
    wall = time.perf_counter()

    group = DaveGroup(CHANNEL)
    bot = group.join(BOT)
    key = [rng.randrange(256) for _ in range(32)]
    conn = FakeConnection(list(key), ssrc=1, dave_session=bot, dave_protocol_version=1)
    sessions = [group.join(USER0 + i) for i in range(max(COUNTS))]
    speakers = [Speaker(i, key, sessions[i], ticks, rng.randrange(100)) for i in range(max(COUNTS))]
    lib = load_libopus()
    setups = {n: Setup(n, speakers, conn, lib) for n in COUNTS}
    setup_s = time.perf_counter() - wall

    for r in range(rounds):
        order = COUNTS[r % len(COUNTS):] + COUNTS[:r % len(COUNTS)]
        for n in order:
            s = setups[n]
            raw = s.run_raw(ticks)
            s.vad_w.spent = 0.0
            whole = s.run_whole(build_packets(s.speakers, ticks))
            s.record("vad_in_whole", s.vad_w.spent / raw)
            stages = s.run_stages(build_packets(s.speakers, ticks))
            s.record("raw_s", raw)
            s.record("whole", whole / raw)
            for name, value in stages.items():
                s.record(name, value / raw)
            s.record("stages", sum(stages.values()) / raw)

    silence_ms = VadConfig().silence_ms
    delays = [endpointing_delay(speakers[i], conn, silence_ticks=silence_ms // 20 + 100) for i in range(5)]

    for s in setups.values():
        expected = rounds * ticks * s.n
        for rx in (s.rx_w, s.rx_s):
            assert rx.stats["ok"] == expected, (rx.stats["ok"], expected, rx.nonzero_stats())
    big = setups[max(COUNTS)]
    names = ("crypto", "resample", "mix", "vad", "engine")
    print(f"discord call path: {rounds} rounds x {seconds:g} s of speech per speaker, N = {COUNTS}; "
          f"DAVE + aead_xchacha20_poly1305_rtpsize; espeak-ng speech, {len(SENTENCES)} texts x {len(VOICES)} voices")
    print("timer: time.process_time (CPU of this process, all threads); each figure = median over rounds of "
          "(CPU for the N speakers' audio) / (raw libopus decode CPU of the same Opus frames, same round)")
    print("VAD: Silero runs once per 20 ms tick on the MIXED frame (by design), not per speaker; "
          "mix/vad/engine are per-tick costs, shared by all N speakers")
    print(f"ratio: {med(big.results['whole']):.3f}")
    print(f"goal: whole path <= {GOAL_RATIO:.1f} at {max(COUNTS)} speakers, flat in N")
    header = f"{'N':>3} {'raw ms/spk-s':>12} {'whole':>7} {'stages':>7} " + " ".join(f"{k:>8}" for k in names)
    print(header + f" {'vad@whole':>9} {'per-spk':>8} {'per-tick':>8}")
    for n, s in setups.items():
        raw_ms = med(s.results["raw_s"]) * 1000 / (n * seconds)
        row = f"{n:>3} {raw_ms:>12.3f} {med(s.results['whole']):>7.3f} {med(s.results['stages']):>7.3f} "
        per_spk = med(s.results["crypto"]) + med(s.results["resample"])
        per_tick = med(s.results["mix"]) + med(s.results["vad"]) + med(s.results["engine"])
        print(row + " ".join(f"{med(s.results[k]):>8.3f}" for k in names)
              + f" {med(s.results['vad_in_whole']):>9.3f} {per_spk:>8.3f} {per_tick:>8.3f}")
    print("columns: whole = the interleaved path; stages = sum of the isolated stages; vad@whole = Silero's share "
          "timed inside the whole path; per-spk = crypto+resample, per-tick = mix+vad+engine (divided among N)")
    wholes = [med(setups[n].results["whole"]) for n in COUNTS]
    at_big = wholes[-1]
    print(f"whole path at {max(COUNTS)}: {at_big:.3f} ({'meets' if at_big <= GOAL_RATIO else 'MISSES'} "
          f"<= {GOAL_RATIO:.1f}); flatness whole(max N)/whole(1) = {wholes[-1] / wholes[0]:.3f}, "
          f"spread max/min over N = {max(wholes) / min(wholes):.3f}")
    print("whole path absolute: " + ", ".join(
        f"N={n} {med(setups[n].results['whole']) * med(setups[n].results['raw_s']) * 1000 / seconds:.1f} ms CPU "
        f"per s of call" for n in COUNTS))
    print("mixed stream (stage pass): " + ", ".join(
        f"N={n} Silero voiced {100 * s.voiced_ticks / s.ticks:.0f}% of ticks, {100 * s.clipped / s.samples:.1f}% "
        f"samples clipped, commits {s.commits} whole / {s.stage_commits} stage" for n, s in setups.items()))
    print(f"endpointing (Silero, silence_ms={silence_ms}, goal <= {silence_ms + 25} ms after the last packet; "
          f"one speaker, sentence then no packets):")
    for i, d in enumerate(delays):
        sp = speakers[i]
        ok = d["commit_ms"] is not None and d["commit_ms"] <= silence_ms + 25
        print(f"  {sp.voice:<15} {d['frames'] * 20:>5} ms speech: commit {d['commit_ms']} ms after last packet "
              f"({'ok' if ok else 'MISS'}); {d['from_voiced_ms']} ms after last frame Silero scored "
              f">= release; quiet tail {d['tail_ms']} ms")
    ok_delays = [d["commit_ms"] for d in delays if d["commit_ms"] is not None]
    if ok_delays:
        print(f"endpointing delay: median {med(ok_delays):.0f} ms, max {max(ok_delays):.0f} ms "
              f"(goal <= {silence_ms + 25} ms; stream time in 20 ms ticks, no network jitter)")
    print(f"receiver stats (N={max(COUNTS)}, whole path): {big.rx_w.nonzero_stats()}")
    print(f"setup {setup_s:.1f} s, total wall {time.perf_counter() - wall:.1f} s")


if __name__ == "__main__":
    main()
