"""Peak memory of `talk --input-wav`'s input path against the length of the file.

Writes 48 kHz stereo 16-bit WAVs of 10 s and 10 min, then, each in a fresh subprocess, pulls every
frame out of `FileTransport.frames()` (unpaced, no tail) and reports the process's peak RSS. The
baseline in the same run is the whole-file path the transport used before (`read_wav` +
`to_mono_24k`). Goal: the streamed 10 min run within 20 MB of the 10 s run.

Run: .venv/bin/python bench/file_input_memory.py [--minutes 10]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.goals import goal  # noqa: E402

RATE = 48_000
GOAL_MB = 20.0


def write_wav(path: Path, seconds: float) -> None:
    """A 440 Hz tone over quiet noise, written a second at a time (the parent stays small)."""
    import numpy as np

    from voice.audio import WavWriter

    rng = np.random.default_rng(7)
    with WavWriter(path, RATE, 2) as writer:
        for start in range(0, int(seconds * RATE), RATE):
            n = min(RATE, int(seconds * RATE) - start)
            t = (start + np.arange(n)) / RATE
            mono = 0.3 * np.sin(2 * math.pi * 440 * t) + 0.01 * rng.standard_normal(n)
            stereo = np.repeat(np.clip(mono * 32767, -32768, 32767).astype("<i2"), 2)
            writer.write(stereo.tobytes())


def child(mode: str, path: Path) -> None:
    """Run one input path over `path`; print frames/bytes produced and peak RSS in MB."""
    produced = 0
    if mode == "stream":
        from voice.call.transports.file import FileTransport

        async def drain() -> int:
            transport = FileTransport(path, path.with_suffix(".out.wav"), realtime=False, tail_silence=False)
            count = 0
            async for frame in transport.frames():
                count += len(frame)
            await transport.aclose()
            return count

        produced = asyncio.run(drain())
    else:
        from voice.audio import read_wav, to_mono_24k

        samples, rate = read_wav(path)
        produced = len(to_mono_24k(samples, rate))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(f"{produced} {peak_mb:.1f}")


def measure(mode: str, path: Path) -> tuple[float, float, int]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(path)], check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[1]), time.perf_counter() - start, int(out[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the long input")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "WAV"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    lengths = {"10 s": 10.0, f"{args.minutes:g} min": args.minutes * 60}
    with tempfile.TemporaryDirectory() as tmp:
        rows = {}
        for label, seconds in lengths.items():
            path = Path(tmp) / f"in-{int(seconds)}.wav"
            write_wav(path, seconds)
            for mode in ("stream", "whole"):
                rows[label, mode] = measure(mode, path)
                peak, elapsed, produced = rows[label, mode]
                print(f"{mode:>6}  {label:>7} ({path.stat().st_size / 2**20:6.1f} MB file): peak RSS "
                      f"{peak:6.1f} MB, {produced / 48_000:7.1f} s of 24 kHz audio, {elapsed:5.1f} s")
        short, long = lengths
        stream_growth = rows[long, "stream"][0] - rows[short, "stream"][0]
        whole_growth = rows[long, "whole"][0] - rows[short, "whole"][0]
        print(f"streamed: {long} uses {stream_growth:+.1f} MB over {short}; "
              f"ratio {rows[long, 'stream'][0] / rows[short, 'stream'][0]:.2f}")
        print(f"baseline, whole file: {long} uses {whole_growth:+.1f} MB over {short}; "
              f"ratio {rows[long, 'whole'][0] / rows[short, 'whole'][0]:.2f}")
        goal("file_input_memory", f"peak RSS of {long} streamed, over {short}: {stream_growth:+.1f} MB",
             f"within {GOAL_MB:g} MB", abs(stream_growth) <= GOAL_MB)


if __name__ == "__main__":
    main()
