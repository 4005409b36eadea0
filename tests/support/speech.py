"""Real sound for tests: espeak-ng renders text (and a noise burst stands in for a cough), as Discord's
48 kHz stereo 20 ms frames."""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soxr

from voice.audio import read_wav

FRAME_48K_STEREO = 48_000 * 2 * 2 // 50  # 3840 bytes


# Five different sentences: different speakers say different things (Silero tests and benches).
UTTERANCES = (
    "please check the build and tell me when the tests are green",
    "what time is the meeting with the design team tomorrow",
    "turn the music down a little, I can barely hear anyone",
    "the deployment failed again on the second server",
    "can somebody read me the last three messages in the channel",
)


@functools.lru_cache(maxsize=32)
def speech_frames(text: str, *, voice: str = "en", speed: int = 175) -> tuple[bytes, ...]:
    """`text` spoken by espeak-ng as 20 ms frames of 48 kHz stereo s16le (the receiver's output)."""
    espeak = shutil.which("espeak-ng")
    assert espeak, "espeak-ng is needed for real speech in tests (apt-get install -y espeak-ng; make test does)"
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run([espeak, "-v", voice, "-s", str(speed), "-w", str(wav), text], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples, rate = read_wav(wav)
    mono = samples.astype(np.float32).mean(axis=1) / 32768.0  # int16 (n, channels) -> float mono
    up = soxr.resample(mono, rate, 48_000)
    pcm = np.repeat(np.clip(up * 32767, -32768, 32767).astype("<i2"), 2).tobytes()
    pcm += bytes(-len(pcm) % FRAME_48K_STEREO)
    return tuple(pcm[i:i + FRAME_48K_STEREO] for i in range(0, len(pcm), FRAME_48K_STEREO))


def noise_burst_frames(ms: int = 150, *, seed: int = 7, amplitude: float = 0.5) -> tuple[bytes, ...]:
    """A cough-like sound with no voice in it: `ms` of low-passed white noise (one-pole, 0.9) that
    rises in 2.5 ms and decays exponentially, as 20 ms frames of 48 kHz stereo s16le."""
    n = 48_000 * ms // 1000
    noise = np.random.default_rng(seed).standard_normal(n)
    shaped = np.empty(n)
    level = 0.0
    for i, sample in enumerate(noise):
        level = 0.9 * level + sample
        shaped[i] = level
    envelope = np.exp(-np.linspace(0, 4, n)) * np.minimum(1.0, np.linspace(0, n / 120, n))
    mono = shaped / np.abs(shaped).max() * envelope * amplitude
    pcm = np.repeat(np.clip(mono * 32767, -32768, 32767).astype("<i2"), 2).tobytes()
    pcm += bytes(-len(pcm) % FRAME_48K_STEREO)
    return tuple(pcm[i:i + FRAME_48K_STEREO] for i in range(0, len(pcm), FRAME_48K_STEREO))
