"""Resume after a crash: `switchboard run` (a real process, real discord.py) in a call on the project's
fake Discord (genuine DAVE) and fake Realtime is killed with SIGKILL mid-call, started again, and timed
from the gateway READY of the new process to the bot speaking in the channel again.

Per restart, on the test process's clock (each mark is when the fake saw it):
  exec       the new process was started (not part of the goal: Python, discord.py and login)
  READY      the fake dispatched READY to the new process (its imports and login are before this)
  rejoined   the fake described the bot's new voice session (op 4 → voice gateway → SESSION_DESCRIPTION)
  DAVE       the fake executed the last DAVE transition the bot was in (op 22): it holds every member's key
  spoke      the first datagram of the bot's "I'm back" a member hears as sound reached the fake's socket
             (noticed by the waiting bench, so at most one loop turn late)
The first three are the fake's own timestamps of those frames.
and how many earlier conversation items the new provider session received before its first answer.

Baseline, measured in the same run: a fresh `/talk join` in the same room (interaction → DAVE ready),
so `ratio` says what rejoining costs against joining. Goal (issue 18): READY → spoke <= 5 s (median).

    python bench/resume.py            # 5 restarts
    python bench/resume.py --runs 9
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import davey  # noqa: E402
import discord.opus  # noqa: E402
import numpy as np  # noqa: E402

from bench.goals import goal  # noqa: E402
from bot.discord.calls import BACK_NOTICE  # noqa: E402
from tests.support.discord_room import in_voice, join_and_settle, room, say  # noqa: E402
from tests.support.fake_discord.speech import OPUS_SILENCE, open_bot_packet  # noqa: E402
from tests.support.fake_realtime import AudioReply  # noqa: E402

GOAL_S = 5.0
WAIT_S = 60.0


def script(ctx):
    if ctx.trigger == "client" and ctx.params.get("instructions"):
        return AudioReply("I'm back.", audio_ms=600)
    return AudioReply("Noted.", audio_ms=400)


def restored_items(received: list[dict]) -> int:
    """Conversation messages a session received (`received`: its events) before its first response.create."""
    count = 0
    for event in received:
        if event.get("type") == "response.create":
            break
        if event.get("type") == "conversation.item.create" and event["item"]["type"] == "message":
            count += 1
    return count


class FirstWord:
    """Watches the bot's datagrams from `start` on (as the fake receives them) for the first one a member
    hears as sound: transport-opened, not Opus silence, DAVE-decrypted by the member, decoded, louder than
    -50 dBFS. Incremental: each datagram is looked at once."""

    def __init__(self, r, start: int) -> None:
        self.r, self.seen = r, start
        self.session = r.fake.voice.bot_session
        self.member = r.fake.voice.relay.local[r.olive.id]
        self.decoder = discord.opus.Decoder()

    def __call__(self) -> bool:
        udp = self.r.fake.journal.udp
        while self.seen < len(udp):
            ssrc, datagram = udp[self.seen]
            self.seen += 1
            if ssrc != self.session.ssrc:
                continue
            frame = open_bot_packet(self.session, datagram)
            if frame == OPUS_SILENCE:
                continue
            try:
                pcm = self.decoder.decode(self.member.decrypt(self.r.fake.bot.id, davey.MediaType.audio, frame))
            except Exception:
                continue
            samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
            if samples.size and np.sqrt(np.mean(samples ** 2)) > 32768 * 10 ** (-50 / 20):
                return True
        return False


async def timed_join(r) -> float:
    """`/talk join` in a fresh process: INTERACTION_CREATE dispatched → the last DAVE transition executed."""
    frames = len(r.fake.journal.frames)
    await join_and_settle(r, r.olive)
    new = r.fake.journal.frames[frames:]
    asked = next(f.at for f in new if f.event == "INTERACTION_CREATE")
    return max(f.at for f in new if f.link == "voice" and f.direction == "out" and f.op == 22) - asked


async def measure(runs: int, turns: int) -> tuple[list[dict], list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        said = [f"note number {i} for the meeting" for i in range(turns)]
        async with room(Path(tmp), script, transcripts={"olive": said}) as r:
            loop = asyncio.get_running_loop()
            journal = r.fake.journal
            joins = [await timed_join(r)]
            for _ in range(turns):
                await say(r, r.olive, text="note this for the meeting on thursday")
            await r.recorded(lambda calls: calls and sum(t[0] == "user" for t in calls[0]["turns"]) >= turns, WAIT_S)
            results = []
            for _ in range(runs):
                await r.kill()
                readies = len(journal.dispatched("READY"))
                spoken = len(journal.udp)
                frames = len(journal.frames)
                spawned = time.monotonic()
                await r.start()
                await in_voice(r)
                new = journal.frames[frames:]
                ready = next(f.at for f in new if f.event == "READY")
                rejoined = next(f.at for f in new if f.link == "voice" and f.direction == "out" and f.op == 4)
                dave = max(f.at for f in new if f.link == "voice" and f.direction == "out" and f.op == 22)
                await journal.wait_for(FirstWord(r, spoken), WAIT_S)
                spoke = loop.time()
                assert len(journal.dispatched("READY")) == readies + 1
                assert any(BACK_NOTICE in str(e.get("response", {}).get("instructions")) for e in r.realtime.received
                           if e.get("type") == "response.create")
                results.append({"boot": ready - spawned, "rejoined": rejoined - ready, "dave": dave - ready, "spoke": spoke - ready,
                                "items": restored_items(r.realtime.received_on(r.realtime.connections))})
                await r.realtime.wait_for(lambda: any(e.get("type") == "response.done" for e in r.realtime.sent), WAIT_S)
            # baseline: the same room, a fresh join (leave first)
            await r.command("talk leave", r.olive)
            for _ in range(2):
                await r.kill()
                await r.start()
                joins.append(await timed_join(r))
                await r.command("talk leave", r.olive)
    return results, joins


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5, help="restarts to time")
    parser.add_argument("--turns", type=int, default=3, help="turns spoken before the first crash")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} at start")
    wall = time.perf_counter()
    results, joins = asyncio.run(measure(args.runs, args.turns))
    print(f"\n{'restart':>7} | {'exec→READY':>10} | {'READY→rejoined':>14} | {'READY→DAVE':>10} | {'READY→spoke':>11} | earlier items")
    for i, row in enumerate(results, 1):
        print(f"{i:>7} | {row['boot']:>8.2f} s | {row['rejoined']:>12.2f} s | {row['dave']:>8.2f} s | {row['spoke']:>9.2f} s | {row['items']}")
    spoke = statistics.median(r["spoke"] for r in results)
    dave = statistics.median(r["dave"] for r in results)
    join = statistics.median(joins)
    print(f"\nmedian READY→rejoined {statistics.median(r['rejoined'] for r in results):.2f} s, READY→DAVE {dave:.2f} s, "
          f"READY→spoke {spoke:.2f} s")
    goal("resume", f"median READY→spoke {spoke:.2f} s", f"<= {GOAL_S:.0f} s", spoke <= GOAL_S)
    print(f"baseline: a fresh /talk join → DAVE ready, median of {len(joins)}: {join:.2f} s; "
          f"ratio rejoin/join {dave / join:.2f}")
    print(f"total wall {time.perf_counter() - wall:.1f} s")


if __name__ == "__main__":
    main()
