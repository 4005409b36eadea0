"""Call-engine latency against the local fake GA server with zero model delay.

  added latency: end of user speech (local endpointing: the moment the silence window closes, the
      window itself excluded) -> first audio frame handed to the transport. Baseline in the same
      run: a bare websocket client sending commit + response.create to the same fake and waiting
      for the first audio delta — the floor any client pays on this machine.
  barge-in cut: the user frame that makes the VAD declare speech -> playback stopped
      (transport.clear()), while the assistant is mid-answer. The VAD's own start window
      (60 ms of voiced audio) is reported separately: it is a setting, not engine work.

Run: .venv/bin/python bench/call_latency.py [--turns N]
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

from websockets.asyncio.client import connect  # noqa: E402

from tests.support.fake_realtime import AudioReply, FakeRealtime, b64, silence_pcm16, tone_pcm16  # noqa: E402
from tests.support.virtual_transport import VirtualTransport  # noqa: E402
from voice.call.core import CallOptions  # noqa: E402
from voice.call.engine import CallEngine  # noqa: E402
from voice.call.identity import Identity  # noqa: E402
from voice.call.providers import OpenAIRealtime  # noqa: E402
from voice.call.tools import ToolCatalogue  # noqa: E402
from voice.call.vad import VadConfig  # noqa: E402


class TimedTransport(VirtualTransport):
    """Stamps when frames are taken, when the first audio of each item arrives, and clears."""

    def __init__(self) -> None:
        super().__init__(autoplay=False)
        self.frame_times: list[float] = []
        self.first_play: dict[str, float] = {}
        self.clear_times: list[float] = []

    async def frames(self):
        async for frame in super().frames():
            self.frame_times.append(time.perf_counter())
            yield frame

    def play(self, pcm: bytes, item_id: str) -> None:
        self.first_play.setdefault(item_id, time.perf_counter())
        super().play(pcm, item_id)

    def clear(self) -> None:
        self.clear_times.append(time.perf_counter())
        super().clear()


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
    engine = CallEngine(provider, transport, ToolCatalogue(), Identity("bench"),
                        options=CallOptions(endpointing="local", vad=vad), clock=time.perf_counter)
    task = asyncio.create_task(engine.run())
    added, cuts = [], []
    frames_per_silence = vad.silence_ms // 20
    try:
        for _ in range(turns):
            transport.push(tone_pcm16(300, 300.0) + silence_pcm16(vad.silence_ms + 100))
            before = set(transport.first_play)
            start_index = len(transport.frame_times)
            await wait_until(lambda before=before: set(transport.first_play) - before)
            item = (set(transport.first_play) - before).pop()
            speech_frames = 300 // 20
            end_frame = transport.frame_times[start_index + speech_frames + frames_per_silence - 1]
            added.append(transport.first_play[item] - end_frame)
            # barge in while the (long) answer is still queued for playback
            clears = len(transport.clear_times)
            index = len(transport.frame_times)
            transport.push(tone_pcm16(200, 300.0))
            await wait_until(lambda clears=clears: len(transport.clear_times) > clears)
            trigger = transport.frame_times[index + vad.start_ms // 20 - 1]
            cuts.append(transport.clear_times[-1] - trigger)
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
    print(f"added latency median: {a:.2f} ms  (p90 {p90:.2f} ms; goal <= 30 ms)")
    print(f"bare websocket client floor median: {f:.2f} ms")
    print(f"barge-in cut median: {c:.3f} ms  (goal <= 40 ms; plus the VAD's 60 ms start window)")


if __name__ == "__main__":
    asyncio.run(main())
