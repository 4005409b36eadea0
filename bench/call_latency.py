"""Call-engine latency against the local fake GA server with zero model delay.

  added latency: end of user speech (local endpointing: the moment the silence window closes, the
      window itself excluded) -> first audio frame handed to the transport. Baseline in the same
      run: a bare websocket client sending commit + response.create to the same fake and waiting
      for the first audio delta — the floor any client pays on this machine.
  barge-in cut: the user frame that makes the VAD declare speech -> playback stopped
      (transport.clear()), while the assistant is mid-answer. The VAD's own start window
      (60 ms of voiced audio) is reported separately: it is a setting, not engine work.

The user speaks real speech (espeak-ng, tests/support/speech.py): local endpointing is the trained
Silero VAD, which rightly hears no voice in a tone. Run: .venv/bin/python bench/call_latency.py [--turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

from bench.goals import goal  # noqa: E402
from tests.support.fake_realtime import AudioReply, FakeRealtime, b64, silence_pcm16, tone_pcm16  # noqa: E402
from tests.support.speech import speech_frames  # noqa: E402
from tests.support.virtual_transport import VirtualTransport  # noqa: E402
from voice.audio import to_mono_24k  # noqa: E402
from voice.call.core import CallCore, CallOptions  # noqa: E402
from voice.call.engine import CallEngine, speech_detector  # noqa: E402
from voice.call.identity import Identity  # noqa: E402
from voice.call.providers import OpenAIRealtime  # noqa: E402
from voice.call.tools import ToolCatalogue  # noqa: E402
from voice.call.vad import VadConfig  # noqa: E402


class TimedTransport(VirtualTransport):
    """Stamps when frames are taken, which frame closed a turn, when the first audio of each item
    arrives, and clears (with the frame being handled when playback was stopped)."""

    def __init__(self) -> None:
        super().__init__(autoplay=False)
        self.core: CallCore | None = None  # the engine's, to see which frame closed a turn
        self.frame_times: list[float] = []
        self.turn_end_frames: list[float] = []
        self.first_play: dict[str, float] = {}
        self.clear_times: list[float] = []
        self.clear_triggers: list[float] = []

    async def frames(self):
        async for frame in super().frames():
            self.frame_times.append(time.perf_counter())
            turns = self.core.counters["turns"] if self.core is not None else 0
            yield frame  # the engine handles the frame before it asks for the next one
            if self.core is not None and self.core.counters["turns"] > turns:
                self.turn_end_frames.append(self.frame_times[-1])

    def play(self, pcm: bytes, item_id: str) -> None:
        self.first_play.setdefault(item_id, time.perf_counter())
        super().play(pcm, item_id)

    def clear(self) -> None:
        self.clear_times.append(time.perf_counter())
        self.clear_triggers.append(self.frame_times[-1])  # cleared while handling the latest frame
        super().clear()


def speech_pcm16(text: str) -> bytes:
    """`text` spoken by espeak-ng as the engine's input: 24 kHz mono s16le."""
    pcm = b"".join(speech_frames(text))
    return to_mono_24k(np.frombuffer(pcm, "<i2").reshape(-1, 2), 48_000)


async def bare_round_trip(url: str, turns: int) -> list[float]:
    """Floor: commit + response.create -> first audio delta with a plain websocket client."""
    out = []
    async with connect(url, additional_headers={"Authorization": "Bearer bench"}) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"turn_detection": None}}}}))
        for _ in range(turns):
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(tone_pcm16(200))}))
            t0 = time.perf_counter()
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            await ws.send(json.dumps({"type": "response.create"}))
            while True:
                event = json.loads(await ws.recv())
                if event["type"] == "response.output_audio.delta":
                    out.append(time.perf_counter() - t0)
                if event["type"] == "response.done":
                    break
    return out


async def engine_turns(url: str, turns: int) -> tuple[list[float], list[float]]:
    transport = TimedTransport()
    provider = OpenAIRealtime("bench", "gpt-realtime-2.1-mini", "marin", url=url)
    vad = VadConfig()
    detector = speech_detector(vad)
    if detector.name != "silero":
        raise SystemExit("bench/call_latency.py measures the trained VAD, and Silero did not load")
    engine = CallEngine(provider, transport, ToolCatalogue(), Identity("bench"), detector=detector,
                        options=CallOptions(endpointing="local", vad=vad), clock=time.perf_counter)
    transport.core = engine.core
    question, interruption = speech_pcm16("What time is it in Tokyo?"), speech_pcm16("Wait, stop.")
    task = asyncio.create_task(engine.run())
    added, cuts = [], []
    try:
        for _ in range(turns):
            ended = len(transport.turn_end_frames)
            before = set(transport.first_play)
            transport.push(question + silence_pcm16(vad.silence_ms + 100))
            await wait_until(lambda before=before: set(transport.first_play) - before)
            item = (set(transport.first_play) - before).pop()
            if len(transport.turn_end_frames) != ended + 1:
                raise RuntimeError("the question was not heard as exactly one turn")
            added.append(transport.first_play[item] - transport.turn_end_frames[-1])
            # barge in while the (long) answer is still queued for playback
            clears = len(transport.clear_times)
            transport.push(interruption)
            await wait_until(lambda clears=clears: len(transport.clear_times) > clears)
            cuts.append(transport.clear_times[-1] - transport.clear_triggers[-1])
            transport.push(silence_pcm16(vad.silence_ms + 100))
            await wait_until(lambda: engine.core.idle() and not engine.core.user_speaking, settle=True)
            transport.advance(10_000)
            await wait_until(lambda: engine.core.idle())
    finally:
        engine.stop()
        await task
    return added, cuts


async def wait_until(predicate, settle: bool = False, timeout: float = 5.0) -> None:
    deadline = time.perf_counter() + timeout
    while not predicate():
        if time.perf_counter() > deadline:
            raise TimeoutError("benchmark step timed out")
        await asyncio.sleep(0.001)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=30)
    args = parser.parse_args()
    script = lambda ctx: AudioReply("ok", audio_ms=2000, chunk_ms=100)  # noqa: E731
    async with FakeRealtime(script) as fake:
        floor = await bare_round_trip(fake.url, args.turns)
        added, cuts = await engine_turns(fake.url, args.turns)
    f, a, c = (statistics.median(x) * 1000 for x in (floor, added, cuts))
    p90 = sorted(added)[int(len(added) * 0.9)] * 1000
    print(f"turns: {args.turns}, local endpointing, fake GA server on loopback, zero model delay")
    print(f"ratio: {a / f:.2f}  (engine end-of-speech -> first frame to transport / bare client round trip)")
    print(f"added latency median: {a:.2f} ms  (p90 {p90:.2f} ms)")
    print(f"bare websocket client floor median: {f:.2f} ms")
    print(f"barge-in cut median: {c:.3f} ms  (plus the VAD's 60 ms start window)")
    goal("call_latency", f"added latency median {a:.2f} ms", "<= 30 ms", a <= 30)
    goal("call_latency", f"barge-in cut median {c:.3f} ms", "<= 40 ms", c <= 40)


if __name__ == "__main__":
    asyncio.run(main())
