"""A voice room for end-to-end tests: `switchboard run` (a real process, real discord.py) against the
fake Discord (genuine DAVE) and the fake Realtime server, and members who speak real espeak-ng speech.

    async with room(tmp_path, script, members=[("ann", "Ann")], SWITCHBOARD_CAPTIONS="true") as r:
        await join_and_settle(r, r.members["ann"])
        await say(r, r.members["ann"])                 # a burst (its tail), repeated until a turn is committed
        await speak_live(r.fake, r.members["ann"], opus_speech("hello"))  # paced like a real client

Every member is added before the bot starts; `olive` is the operator (SWITCHBOARD_OPERATOR_USER_IDS)
and `gus` a guest whose display name is also "Olive". A test may `kill()` the bot (SIGKILL, a crash),
`terminate()` it (SIGTERM, a deploy) and `start()` it again on the same fakes and store. At the end the
process is stopped with SIGTERM (the graceful path); every SIGTERM must exit 0, and no log may hold a
traceback or either secret; the fake Realtime must have seen only valid GA events. No text model answers
(`SWITCHBOARD_TEXT_URL` is a closed port) unless a test gives one: recaps go out without a summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import sys
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import discord.opus
import numpy as np
import pytest

from common.store import DB_FILENAME
from tests.support.fake_discord import FakeDiscord, SimUser
from tests.support.fake_discord.speech import hear_bot
from tests.support.fake_realtime import FakeRealtime
from tests.support.speech import speech_frames
from tests.support.store import polled

ROOT = Path(__file__).resolve().parent.parent.parent
FAKE_AGENT = str(Path(__file__).parent / "fake_agent.py")
OPENAI_KEY = "sk-discord-call-NEVER-SHOWN"
WAIT_S = 30.0
FRAME_S = 0.02
MAX_BURST_FRAMES = 15  # the bot keeps 25 frames (500 ms) per member; a longer burst would be shed

REAL_TIME = "real_time"  # the prefix of the xdist groups whose tests pace real-time audio (tests/conftest.py)


def real_time(lane: str) -> pytest.MarkDecorator:
    """The mark of every test that uses `room`: its tests run one after another on one xdist worker
    (`--dist loadgroup`, pyproject.toml), at normal priority while the other workers yield the CPU
    (tests/conftest.py). A few lanes run side by side: each bot paces audio in real time and mostly
    waits, so two cores hold several lanes — but not every room test at once."""
    return pytest.mark.xdist_group(f"{REAL_TIME}_{lane}")


def opus_speech(text: str, **voice: int | str) -> list[bytes]:
    """`text` spoken by espeak-ng, as the Opus frames a client sends."""
    return opus_frames(speech_frames(text, **voice))


def opus_frames(pcm_frames: Iterable[bytes]) -> list[bytes]:
    """20 ms frames of 48 kHz stereo s16le as Opus."""
    encoder = discord.opus.Encoder()
    return [encoder.encode(frame, 960) for frame in pcm_frames]


@dataclass
class Room:
    fake: FakeDiscord
    realtime: FakeRealtime
    members: dict[str, SimUser]  # by username; "olive" (the operator) and "gus" are always there
    home: Path
    env: dict[str, str]
    workdir: Path
    proc: asyncio.subprocess.Process | None = None
    logs: list[Path] = field(default_factory=list)  # one per process started, in order
    codes: list[int] = field(default_factory=list)  # how each process stopped with `terminate` exited

    async def start(self) -> None:
        """Start `switchboard run` (again) and wait for its gateway READY."""
        assert self.proc is None, "the bot is still running"
        readies = len(self.fake.journal.dispatched("READY"))
        log_path = self.workdir / f"switchboard-{len(self.logs) + 1}.log"
        self.logs.append(log_path)
        with log_path.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.support.fake_discord.run_switchboard", cwd=ROOT, env=self.env,
                stdout=log, stderr=log)
        await self.fake.journal.wait_for(lambda: len(self.fake.journal.dispatched("READY")) > readies, WAIT_S)

    async def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill: nothing runs on the way out."""
        assert self.proc is not None and self.proc.returncode is None
        self.proc.kill()
        await self.proc.wait()
        self.proc = None

    async def terminate(self) -> int:
        """SIGTERM (the graceful path, a deploy); its exit code."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.terminate()
        code = await asyncio.wait_for(self.proc.wait(), 20)
        self.codes.append(code)
        self.proc = None
        return code

    def log_text(self) -> str:
        return "\n".join(p.read_text() for p in self.logs if p.exists())

    @property
    def olive(self) -> SimUser:
        return self.members["olive"]

    @property
    def gus(self) -> SimUser:
        return self.members["gus"]

    async def command(self, command: str, user: SimUser, options: dict | None = None) -> dict:
        """Run a slash command as `user`; the response's data, or the first follow-up once deferred."""
        pending = await self.fake.send_interaction(command, options, user=user)
        response = await self.fake.wait_response(pending, timeout=WAIT_S)
        if response["type"] == 5:
            await self.fake.journal.wait_for(lambda: pending.followups, WAIT_S)
            return pending.followups[0]
        return response["data"]

    def tickets(self) -> list[tuple]:
        if not (self.home / DB_FILENAME).exists():
            return []
        with sqlite3.connect(self.home / DB_FILENAME) as db:
            return db.execute("SELECT id, requester_id, task FROM runs ORDER BY id").fetchall()

    def calls(self) -> list[dict]:
        """Every voice call recorded in the store (`voice_calls`), oldest first, with its turns as
        (role, speaker id, text) and `spoken`: ms spoken by user id."""
        if not (self.home / DB_FILENAME).exists():
            return []
        with contextlib.closing(sqlite3.connect(self.home / DB_FILENAME)) as db:
            db.row_factory = sqlite3.Row
            if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'voice_calls'").fetchone():
                return []
            calls = [dict(row) for row in db.execute("SELECT * FROM voice_calls ORDER BY id")]
            for call in calls:
                call["turns"] = db.execute("SELECT role, speaker_id, text FROM voice_call_turns WHERE call_id = ? "
                                           "ORDER BY seq", (call["id"],)).fetchall()
                call["turns"] = [tuple(t) for t in call["turns"]]
                call["spoken"] = dict(db.execute("SELECT user_id, spoken_ms FROM voice_call_speakers WHERE call_id = ?",
                                                 (call["id"],)).fetchall())
        return calls

    def facts(self) -> list[dict]:
        """Durable facts in the store (`listener_facts`), oldest first."""
        if not (self.home / DB_FILENAME).exists():
            return []
        with contextlib.closing(sqlite3.connect(self.home / DB_FILENAME)) as db:
            db.row_factory = sqlite3.Row
            return [dict(row) for row in db.execute("SELECT * FROM listener_facts ORDER BY id")]

    async def recorded(self, predicate, timeout: float = WAIT_S) -> list[dict]:
        """`calls()` once `predicate(calls)` holds (the bot writes turns in the background)."""
        return await self.stored(self.calls, predicate, timeout)

    async def stored(self, read, predicate, timeout: float = WAIT_S):
        """`read()` (what the bot's process wrote to the store) once `predicate` holds of it: polled, as
        another process's writes cannot be waited on."""
        return await polled(read, predicate, "the store to show what was expected", timeout)

    def outputs(self) -> list[dict]:
        return [json.loads(e["item"]["output"]) for e in self.realtime.received
                if e["type"] == "conversation.item.create" and e["item"]["type"] == "function_call_output"]


@contextlib.asynccontextmanager
async def room(tmp_path: Path, script, *, members: Sequence[tuple[str, str | None]] = (),
               transcripts: Mapping[str, Sequence[str | None]] | None = None, transcript_delay_ms: int = 0,
               **settings: str) -> AsyncIterator[Room]:
    """The fake Discord with `members` ((username, display name) pairs, besides olive and gus), the fake
    Realtime answering with `script` and transcribing each member's turns from `transcripts` (by
    username), and `switchboard run` with Switchboard `settings` (environment variables) on top."""
    async with FakeDiscord(voice=True, workdir=tmp_path) as fake:
        people = {"olive": fake.add_user("olive", nick="Olive"), "gus": fake.add_user("gus", nick="Olive")}
        people.update((username, fake.add_user(username, nick=nick)) for username, nick in members)
        said = {people[username].id: list(texts) for username, texts in (transcripts or {}).items()}
        async with FakeRealtime(script, transcripts=said or None, transcript_delay_ms=transcript_delay_ms) as realtime:
            home = tmp_path / "home"
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
                   **fake.bot_env(), "DISCORD_BOT_TOKEN": fake.token, "OPENAI_API_KEY": OPENAI_KEY,
                   "SWITCHBOARD_REALTIME_URL": realtime.url, "SWITCHBOARD_HOME": str(home),
                   "SWITCHBOARD_OPERATOR_USER_IDS": str(people["olive"].id), "SWITCHBOARD_AGENT_LANES": "command",
                   "SWITCHBOARD_AGENT_COMMAND": f"{sys.executable} {FAKE_AGENT} answer {{task}}",
                   "SWITCHBOARD_RUNS_CHANNEL_ID": str(fake.text_channel.id),
                   "SWITCHBOARD_TEXT_URL": "http://127.0.0.1:9/v1",  # no text model: recaps without a summary
                   **settings}
            r = Room(fake, realtime, people, home, env, tmp_path)
            try:
                await r.start()
                yield r
            finally:
                if r.proc is not None:
                    await r.terminate()  # SIGTERM: the graceful path (a process that died by itself fails here)
            text = r.log_text()
            assert all(code == 0 for code in r.codes), (r.codes, text[-3000:])
            assert OPENAI_KEY not in text and fake.token not in text
            assert "Traceback" not in text, text[-3000:]
            realtime.assert_clean()


async def join_and_settle(r: Room, *members: SimUser) -> None:
    """`members` enter the voice channel, then the operator has the bot join it; returns once the bot
    is in the channel's DAVE group with every member's key and its Realtime session is configured."""
    for member in members:
        await r.fake.join_voice(member)
    joined = await r.command("talk join", r.olive, {"channel": r.fake.voice_channel.id})
    assert joined["embeds"][0]["title"] == "In the call", joined
    await in_voice(r)
    await r.realtime.wait_received("session.update", timeout=WAIT_S)


async def in_voice(r: Room) -> None:
    """The bot's voice session is described and it is a member of the channel's DAVE group."""
    await r.fake.wait_bot_voice(timeout=WAIT_S)
    await r.fake.journal.wait_for(lambda: r.fake.bot.id in r.fake.voice.relay.members, WAIT_S)
    await dave_settled(r)


async def dave_settled(r: Room) -> None:
    """Every DAVE transition the fake announced to the bot (op 29 commit, op 30 welcome) has been
    processed by it (op 23) and executed (op 22): it holds the keys of every member in the group."""
    journal = r.fake.journal

    def settled() -> bool:
        announced = len(journal.frames_of("voice", "out", 29)) + len(journal.frames_of("voice", "out", 30))
        return announced > 0 and len(journal.frames_of("voice", "out", 22)) >= announced

    await journal.wait_for(settled, WAIT_S)


async def say(r: Room, *speakers: SimUser, text: str = "audit the auth module and report back") -> None:
    """Each speaker says `text`, until the engine commits a turn. One speaker sends it as one burst: the
    bot keeps only the last 500 ms of it per member (measured: 1.1 s of a 3.8 s sentence was committed,
    against 4.0 s with `speak_live`), enough for a turn but not for what the turn holds, and it is said
    again if no turn came of it. Several speakers talk at once in real time (`speak_live`), and it
    returns once each has had a turn committed."""
    frames = opus_speech(text)
    before = len(commits(r.realtime))
    if len(speakers) > 1:  # at once, paced as clients send: each burst would keep only its last 500 ms, and
        # whether every speaker's tail then makes a turn depends on how the bursts meet the bot's ticks
        await asyncio.gather(*(speak_live(r.fake, s, frames) for s in speakers))
        await r.realtime.wait_for(lambda: len(commits(r.realtime)) >= before + len(speakers), WAIT_S)
        return
    for _attempt in range(3):  # DAVE may still be settling for the first packets: say it again
        await asyncio.gather(*(r.fake.speak(s, frames) for s in speakers))
        with contextlib.suppress(AssertionError):
            await r.realtime.wait_for(lambda: len(commits(r.realtime)) > before, 8)
            return
    raise AssertionError("the bot never committed a turn")


async def speak_live(fake: FakeDiscord, user: SimUser, frames: Sequence[bytes], *, chunk: int = 5,
                     lead: int = 2) -> float:
    """Relay `frames` as a client does, in real time: `chunk` frames (100 ms) at a time, `lead` chunks
    ahead of the clock (bursts stay well under the 500 ms the bot queues per member). Returns, on the
    loop's clock, when the last frame is due — the moment the speaker stops talking — after waiting
    until then."""
    if (lead + 1) * chunk > MAX_BURST_FRAMES:
        raise ValueError("the bot would shed part of a burst that long")
    loop = asyncio.get_running_loop()
    start = loop.time()
    for first in range(0, len(frames), chunk):
        due = start + (first / chunk - lead) * chunk * FRAME_S
        if (wait := due - loop.time()) > 0:
            await asyncio.sleep(wait)  # real-time pacing: the bot hears a member at Discord's pace
        await fake.speak(user, list(frames[first:first + chunk]), announce=first == 0)
    end = start + len(frames) * FRAME_S
    if (wait := end - loop.time()) > 0:
        await asyncio.sleep(wait)
    return end


# -- what the fake Realtime server was told --------------------------------------------------------


def commits(realtime: FakeRealtime) -> list[int]:
    """Indexes in `realtime.received` of every `input_audio_buffer.commit`."""
    return [i for i, e in enumerate(realtime.received) if e.get("type") == "input_audio_buffer.commit"]


def context_before(realtime: FakeRealtime, index: int) -> str | None:
    """The text of the system message item created right before event `index` (a commit), if it is one."""
    if index == 0:
        return None
    event = realtime.received[index - 1]
    item = event.get("item") or {}
    if event.get("type") != "conversation.item.create" or item.get("type") != "message" or item.get("role") != "system":
        return None
    return item["content"][0]["text"]


# -- what a member heard from the bot --------------------------------------------------------------


def tone_frames(fake: FakeDiscord, listener: SimUser, start: int, end: int | None = None, *,
                rms: float = 2000.0) -> tuple[int, int]:
    """What `listener` decodes from the bot's datagrams `start:end` (in the order the bot sent them):
    how many 20 ms frames have sound (RMS at least `rms`), and how many were not end-to-end encrypted.
    Give each range once: a member's DAVE session decrypts each frame once."""
    pcm, plain = hear_bot(fake.voice.sessions, fake.journal.udp[start:end], fake.voice.relay.local[listener.id],
                          fake.bot.id)
    loud = sum(float(np.sqrt(np.mean(np.frombuffer(frame, dtype="<i2").astype(np.float64) ** 2))) >= rms
               for frame in pcm if frame)
    return loud, plain
