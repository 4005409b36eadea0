"""One call per guild, each with its own engine, catalogue, transport and playback; one speech
detector (`room_vad`) shared by every member of every call.

Joining connects `ListeningVoiceClient`, feeds every member's audio into a `RoomTransport` (each on
their own), plays the assistant through its `PlaybackSource`, and runs a `CallEngine` in local
endpointing — a turn per speaker, answered one at a time, to everyone or only when addressed — whose
mutating tools go through the operator gate. Leaving stops the engine first (tool outputs settle,
undelivered announcements resolve), then leaves voice. A per-guild lock orders join and leave, so
a join right after a leave waits for discord.py to let go of the old voice client.

Each call is a row in the store (`voice.call.records`), written by `bot.discord.call_row`: recorded at join,
every transcript line appended as a turn, the totals (speaking times, usage) as each response or
transcription is reported (a failing store is logged once per call and never holds up the call), `ended`
at leave — or `resume` when the process is shutting down (`leave_all(resume=True)`). At the next
start `join(…, resume=row)` continues such a row (`bot.discord.resume`); a call that ends for good gets its
wrap-up (`on_ended`: the recap and debrief, `bot.discord.wrap_up`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import discord

from bot.discord.call_row import CallRow, open_row
from bot.discord.captions import CaptionThread
from bot.discord.gate import OperatorGate, PhoneDataGate
from bot.discord.posts import PostError, send
from bot.discord.untrusted import escape_caller_text
from bot.tools import call_tools
from bot.tools.phone import known_facts
from common.tasks import BackgroundTasks
from listener.archive import Archive
from runs import RunService
from voice.call.attribution import CallInfo
from voice.call.core import REPLY_MODES, CallOptions, HistoryTurn, ShowTranscript
from voice.call.engine import CallEngine, CallFailed, room_vad
from voice.call.identity import Identity, MemorySource
from voice.call.providers import RealtimeProvider
from voice.call.records import CallRecord, CallRecords
from voice.call.tools import ToolCatalogue
from voice.call.usage import NO_USAGE, CallUsage
from voice.call.vad import VadBank, VadConfig
from voice.media.channel import RoomClock, RoomTransport
from voice.media.discord_client import ListeningVoiceClient

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 20.0
LEAVE_TIMEOUT_S = 8.0
BACK_NOTICE = "I'm back: Switchboard restarted, and I remember what we were talking about."
LIMIT_NOTICE_WAIT_S = 30.0  # at the call limit, the goodbye waits this long for the floor, then the call ends anyway
WRAP_UP_WAIT_S = 3.0  # at shutdown, a call's recap still being written gets this long


@dataclass(frozen=True)
class RoomOptions:
    """How a call treats the room (SWITCHBOARD_REPLY_TO, _FOLLOWUP_S, _MIN_INTERRUPTION_MS, _CAPTIONS)."""

    reply_to: str = "everyone"
    followup_s: float = 15.0
    min_interruption_ms: int = 400
    captions: bool = False
    addressed: Callable[[str], bool] | None = None  # the direct-address rule (the listener's, one implementation)
    agent_name: str = "Ares"
    rollover_s: float | None = None  # SWITCHBOARD_SESSION_ROLLOVER_S: the next provider session opens before this


@dataclass
class GuildCall:
    guild_id: int
    channel_id: int
    voice: ListeningVoiceClient
    transport: RoomTransport
    engine: CallEngine
    task: asyncio.Task
    detach: Callable[[], None]
    started_at: float = field(default_factory=time.time)
    requested_by: int | None = None
    text_channel_id: int | None = None
    deaf_watch: asyncio.Task | None = None
    idle_timer: asyncio.Task | None = None
    limit_timer: asyncio.Task | None = None
    rejoined: bool = False
    captions: CaptionThread | None = None
    record_id: int | None = None  # its row in voice_calls; None when the store would not take it
    row: CallRow | None = None  # writes that row as the call goes
    spoken_before: dict[int, int] = field(default_factory=dict)  # ms each person spoke before a restart
    usage_before: CallUsage = NO_USAGE  # what the provider reported before a restart

    def usage(self) -> CallUsage:
        return self.usage_before + self.engine.usage

    def counts(self) -> Counter[str]:
        """What this call counted in this process: turns committed, frames shed, provider reconnects and
        rollovers (read by `/metrics`, `bot.fleet.readings`)."""
        counters = self.engine.core.counters
        return Counter(turns=counters["turns"], frames_shed=self.transport.frames_shed,
                       reconnects=counters["reconnects"], rollovers=counters["rollovers"])

    def spoken_ms(self) -> dict[int, int]:
        """How long each person has spoken in the call, before and since a restart."""
        totals = dict(self.spoken_before)
        for user_id, ms in self.engine.spoken_ms.items():
            if user_id is not None:
                totals[user_id] = totals.get(user_id, 0) + int(ms)
        return totals


# Called once a call has ended for good (not when it is kept to resume): its row id and, when this process
# held it, the call itself (speaking times, usage). The recap and the debrief hang here.
CallEnded = Callable[[int, "GuildCall | None"], Awaitable[None]]


class CallManager:
    def __init__(self, client: discord.Client, *, runs: Callable[[], RunService], gate: OperatorGate,
                 provider: Callable[[], RealtimeProvider], identity: Callable[[MemorySource], Identity],
                 deaf_after_s: float = 5.0, idle_leave_s: float = 120.0, max_minutes: float | None = None,
                 room: RoomOptions | None = None, records: Callable[[], CallRecords] | None = None,
                 on_ended: CallEnded | None = None, home_guilds: frozenset[int]) -> None:
        self._client = client
        self.room = room or RoomOptions()
        self._vad: VadBank | None = None  # loaded at the first join, then shared by every call
        self._room_clock: RoomClock | None = None  # one tick, one batched VAD run, for every call
        self._closing: set[asyncio.Task] = set()
        self._deaf_after_s = deaf_after_s
        self._idle_leave_s = idle_leave_s
        self._max_minutes = max_minutes
        self._runs = runs
        self._gate = gate
        self._phone = PhoneDataGate(gate, home_guilds)  # the phone tools: an operator alone, in a home server
        self._provider = provider
        self._identity = identity
        self._records = records  # late-bound: the store arrives with the services
        self._on_ended = on_ended
        self._tasks = BackgroundTasks(log)  # announcements and wrap-ups on their way
        self._calls: dict[int, GuildCall] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._left_counts: Counter[str] = Counter()  # what calls that ended in this process counted

    def active(self, guild_id: int) -> bool:
        return guild_id in self._calls

    def get(self, guild_id: int) -> GuildCall | None:
        return self._calls.get(guild_id)

    def all(self) -> list[GuildCall]:
        return list(self._calls.values())

    def counts(self) -> Counter[str]:
        """Every call's `GuildCall.counts` since the process started (ended and live ones), and `late_ticks`:
        room ticks that began more than one period late. Only ever grows."""
        totals = Counter(self._left_counts)
        for call in self._calls.values():
            totals.update(call.counts())
        totals["late_ticks"] = self._room_clock.late_ticks if self._room_clock is not None else 0
        return totals

    def _lock(self, guild_id: int) -> asyncio.Lock:
        return self._locks.setdefault(guild_id, asyncio.Lock())

    async def join(self, guild: discord.Guild, channel: discord.abc.Connectable, *,
                   requested_by: int | None = None, text_channel_id: int | None = None,
                   rejoined: bool = False, resume: CallRecord | None = None) -> str:
        """Join `channel` and hold a call there. `resume`: the row of a call the process was in when it
        stopped — the same row goes on (its mode, captions and requester), the new session starts with its
        recent turns, and the call says once that it is back."""
        async with self._lock(guild.id):
            existing = self._calls.get(guild.id)
            if existing is not None and existing.channel_id == channel.id:
                return f"Already talking in <#{channel.id}>."
            if existing is not None:
                await self._leave_locked(guild.id, "moving to another channel")
            if resume is not None:
                requested_by, text_channel_id = resume.started_by, resume.text_channel_id
            provider = self._provider()  # per call: its own socket, key checked at start-up
            voice = await channel.connect(cls=ListeningVoiceClient.factory(deaf_after_s=self._deaf_after_s,
                                                                           pcm_rate=24_000, pcm_channels=1),
                                          self_deaf=False, timeout=CONNECT_TIMEOUT_S, reconnect=True)
            assert isinstance(voice, ListeningVoiceClient)
            loop = asyncio.get_running_loop()
            if self._vad is None:
                self._vad = await asyncio.to_thread(room_vad, log)  # loading the model takes ~0.2 s, once
                self._room_clock = RoomClock(self._vad)
            transport = RoomTransport(names=lambda user_id: _display_name(guild, user_id), loop=loop, vad=self._vad,
                                      room_clock=self._room_clock)
            voice.add_sink(transport.on_speech)
            runs = self._runs()
            catalogue = ToolCatalogue(self._gate, call_tools(runs, owner=self._phone))
            room = self.room
            reply_to = resume.mode if resume is not None and resume.mode in REPLY_MODES else room.reply_to
            captions = resume.captions if resume is not None else room.captions
            options = CallOptions(endpointing="local", vad=VadConfig(), reply_to=reply_to,
                                  addressed=room.addressed, followup_s=room.followup_s,
                                  min_interruption_ms=room.min_interruption_ms, rollover_s=room.rollover_s)
            started_at = resume.started_at if resume is not None else time.time()
            records = self._records_or_none()
            record_id = None if records is None else await open_row(
                records, guild_id=guild.id, channel_id=channel.id, text_channel_id=text_channel_id,
                requested_by=requested_by, mode=reply_to, captions=captions, started_at=started_at, resume=resume)
            # the call's id outlives the process with its row: runs it started are found by it in the recap
            call_id = f"call-{record_id}" if record_id is not None else f"g{guild.id}-{int(started_at)}"
            info = CallInfo(call_id, guild.id, channel.id)
            memory = await known_facts(Archive(runs.store), guild.id)  # this server's calls' facts; never the phone's
            history = [HistoryTurn(t.role, t.text, t.speaker_id, t.name if t.role == "user" else None)
                       for t in resume.turns] if resume is not None else []
            engine = CallEngine(provider, transport, catalogue, self._identity(memory), options=options, call=info,
                                vad_name=self._vad.name, history=history,
                                on_transcript=lambda line, g=guild: self._heard(g, line),
                                on_usage=lambda _total, g=guild.id: self._usage_reported(g))
            voice.play(transport.source)
            detach = runs.attach(engine)
            task = asyncio.create_task(engine.run(), name=f"call-{guild.id}")
            call = GuildCall(guild.id, channel.id, voice, transport, engine, task, detach, started_at=started_at,
                             requested_by=requested_by, text_channel_id=text_channel_id, rejoined=rejoined,
                             record_id=record_id,
                             spoken_before=dict(resume.spoken_ms) if resume is not None else {},
                             usage_before=resume.usage if resume is not None else NO_USAGE)
            if records is not None and record_id is not None:
                call.row = CallRow(records, record_id, lambda c=call: (c.spoken_ms(), c.usage()), call_id=call_id)
            self._calls[guild.id] = call
            if captions:
                await self._start_captions(guild, call, channel)
            call.deaf_watch = asyncio.create_task(
                voice.watch_deafness(lambda g=guild, c=channel: self._deaf(g, c),
                                     on_unheard=lambda user_id, g=guild, c=channel: self._unheard(g, c, user_id)),
                name=f"deaf-{guild.id}")
            task.add_done_callback(lambda t, g=guild.id: self._engine_ended(g, t))
            log.info("call %s: %s channel %s of guild %s", info.call_id, "rejoined" if resume else "joined",
                     channel.id, guild.id)
            self._watch_idle(guild, call)
            if self._max_minutes is not None:
                call.limit_timer = asyncio.create_task(self._limit_leave(guild, call), name=f"limit-{guild.id}")
            if resume is not None:  # said once, when the floor is free; the earlier turns are in the session
                self._spawn(call.engine.announce(BACK_NOTICE), f"back-{guild.id}")
            mode = ("I answer everyone." if reply_to == "everyone" else
                    f"I answer only when someone says my name ({room.agent_name}) first, and then their follow-ups.")
            return (f"Talking in <#{channel.id}> with {provider.name} {provider.model}, voice {provider.voice}. "
                    f"Everyone can talk; only operators can start or stop work. {mode}")

    async def set_captions(self, guild: discord.Guild, on: bool) -> str:
        """`/talk captions`: a thread of captions for this call, or none."""
        call = self._calls.get(guild.id)
        if call is None:
            raise LookupError("I am not in a voice channel here.")
        if not on:
            captions, call.captions = call.captions, None
            if captions is not None:
                await captions.close()
            return "Captions are off."
        if call.captions is None:
            channel = guild.get_channel(call.channel_id)
            await self._start_captions(guild, call, channel)
        captions = call.captions
        return f"Captions: {captions.status()}" if captions is not None else \
            "Captions need a text channel: use `/talk join` in one."

    async def _start_captions(self, guild: discord.Guild, call: GuildCall, channel: object) -> None:
        text = guild.get_channel(call.text_channel_id) if call.text_channel_id is not None else None
        if not isinstance(text, discord.TextChannel):
            log.warning("call %s: captions need a text channel; /talk join was not used in one", call.engine.call.call_id)
            return
        call.captions = CaptionThread(text, agent_name=self.room.agent_name,
                                      voice_channel_name=getattr(channel, "name", None), call_id=call.engine.call.call_id)
        await call.captions.start()

    def _heard(self, guild: discord.Guild, line: ShowTranscript) -> None:
        """A line of the conversation: to the call's record and its captions thread (never raises)."""
        call = self._calls.get(guild.id)
        if call is None:
            return
        name = line.name or (_display_name(guild, line.speaker) if line.speaker is not None else None)
        if call.row is not None:
            shown = (name or "someone") if line.role == "user" else self.room.agent_name
            call.row.add_turn(line.role, line.speaker, shown, line.text, time.time())
        if call.captions is not None:
            call.captions.add(line.role, name or "someone", line.text)

    def _usage_reported(self, guild_id: int) -> None:
        """The provider reported a response's or a transcription's usage: to the call's row at once, so a
        crash right after an answer loses none of it."""
        call = self._calls.get(guild_id)
        if call is not None and call.row is not None:
            call.row.totals_changed()

    def ended_elsewhere(self, record_id: int) -> None:
        """A call this process never held has ended (its row says so): its wrap-up (recap, debrief)."""
        self._wrap_up(record_id, None)

    def _wrap_up(self, record_id: int, call: GuildCall | None) -> None:
        if self._on_ended is not None:
            self._spawn(self._on_ended(record_id, call), f"wrap-up-{record_id}")

    def _records_or_none(self) -> CallRecords | None:
        return self._records() if self._records is not None else None

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        return self._tasks.spawn(coro, name)

    def set_mode(self, guild_id: int, mode: str) -> str:
        """`/talk mode`: answer everyone, or only turns addressed to the assistant, in this call."""
        call = self._calls.get(guild_id)
        if call is None:
            raise LookupError("I am not in a voice channel here.")
        if mode not in REPLY_MODES:
            raise ValueError(f"mode must be one of {', '.join(REPLY_MODES)}")
        call.engine.core.set_reply_to(mode)
        log.info("call %s: reply mode %s", call.engine.call.call_id, mode)
        if mode == "everyone":
            return "I'll answer everyone in this call."
        return (f"I'll answer only when someone starts with my name ({self.room.agent_name}, …), and their "
                f"follow-ups within {self.room.followup_s:g} s.")

    async def leave(self, guild_id: int, *, reason: str, resume: bool = False) -> str:
        async with self._lock(guild_id):
            return await self._leave_locked(guild_id, reason, resume=resume)

    async def leave_all(self, reason: str, *, resume: bool = False) -> None:
        """Leave every call; `resume` (the process is shutting down) marks them to rejoin, not ended."""
        await asyncio.gather(*(self.leave(g, reason=reason, resume=resume) for g in list(self._calls)),
                             return_exceptions=True)
        if self._closing:  # captions flush their last lines (each bounded) before the gateway closes
            await asyncio.gather(*self._closing, return_exceptions=True)
        if self._tasks:  # recaps being written get WRAP_UP_WAIT_S; one cut short is logged
            _, pending = await asyncio.wait(set(self._tasks), timeout=WRAP_UP_WAIT_S)
            for task in pending:
                log.warning("%s: not finished at shutdown; cancelled", task.get_name())
                task.cancel()
        if self._room_clock is not None:
            await self._room_clock.aclose()

    async def _leave_locked(self, guild_id: int, reason: str, *, resume: bool = False) -> str:
        call = self._calls.pop(guild_id, None)
        if call is None:
            return "I was not in a voice channel here."
        for task in (call.deaf_watch, call.idle_timer, call.limit_timer):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if call.captions is not None:  # what is pending goes out (bounded), without holding up the leave
            closing = asyncio.get_running_loop().create_task(call.captions.close(), name=f"captions-{guild_id}")
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        call.detach()
        call.engine.stop()
        call.transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(call.task), LEAVE_TIMEOUT_S)
        except (TimeoutError, CallFailed, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("call in guild %s ended with an error", guild_id)
        self._left_counts.update(call.counts())
        if call.row is not None:  # after the call's last turns: `ended` with why, or `resume` (stopping)
            await call.row.close(reason, resume=resume)
        call.voice.stop()
        try:
            await asyncio.wait_for(call.voice.disconnect(force=True), LEAVE_TIMEOUT_S)
        except TimeoutError:
            log.warning("guild %s: leaving voice took longer than %s s", guild_id, LEAVE_TIMEOUT_S)
        if not resume and call.record_id is not None:
            self._wrap_up(call.record_id, call)
        minutes = (time.time() - call.started_at) / 60
        log.info("guild %s: left voice (%s) after %.1f min", guild_id, reason, minutes)
        return f"Left <#{call.channel_id}> after {minutes:.0f} min."

    async def _deaf(self, guild: discord.Guild, channel: discord.abc.Connectable) -> None:
        """Audio arrives but nothing decodes: rejoin once and say so in the text channel."""
        call = self._calls.get(guild.id)
        if call is None:
            return
        if call.rejoined:
            await self._say(call.text_channel_id, f"I still hear nothing in <#{channel.id}> after rejoining (audio "
                            "arrives but does not decode). Try `/talk leave`, then `/talk join`; `/talk status` shows "
                            "the receiver counters.")
            return
        text, requested_by = call.text_channel_id, call.requested_by
        await self.leave(guild.id, reason="deaf: rejoining")
        try:
            await self.join(guild, channel, requested_by=requested_by, text_channel_id=text, rejoined=True)
        except Exception as exc:
            await self._say(text, f"I stopped hearing anyone in <#{channel.id}> and could not rejoin: {exc}")
            return
        await self._say(text, f"I stopped hearing anyone in <#{channel.id}> (audio arrived but did not decode), "
                              "so I rejoined.")

    async def _unheard(self, guild: discord.Guild, channel: discord.abc.Connectable, user_id: int) -> None:
        """One member's audio arrives but never decrypts or decodes: name them once, say what to try."""
        call = self._calls.get(guild.id)
        if call is None:
            return
        name = _display_name(guild, user_id) or "someone"
        health = call.voice.receiver.member_health().get(user_id, {}) if call.voice.receiver else {}
        what = ("arrives corrupted" if health.get("reason") == "opus_fail"
                else "arrives but does not decrypt (their end-to-end encryption is out of step)")
        await self._say(call.text_channel_id,
                        f"I can't hear {escape_caller_text(name)} "
                        f"(<@{user_id}>) in <#{channel.id}>: their audio {what}. Leaving and rejoining the voice "
                        "channel, or updating or restarting their Discord app, usually fixes it.")

    async def _say(self, channel_id: int | None, text: str) -> None:
        if channel_id is None:
            log.warning("%s", text)
            return
        try:
            await send(self._client, channel_id, content=text)
        except PostError as exc:
            log.warning("%s: %s", exc, text)

    def _engine_ended(self, guild_id: int, task: asyncio.Task) -> None:
        """The engine stopped by itself (the provider failed for good): leave the channel too."""
        call = self._calls.get(guild_id)
        if call is None or call.task is not task:
            return
        if not task.cancelled() and task.exception() is not None:
            log.error("guild %s: the call failed: %s", guild_id, task.exception())
        asyncio.get_running_loop().create_task(self.leave(guild_id, reason="the call ended"))

    def on_voice_state(self, member: discord.Member, before: discord.VoiceState, after: discord.VoiceState) -> None:
        call = self._calls.get(member.guild.id)
        if call is None:
            return
        me = self._client.user
        if me is not None and member.id == me.id:
            if after.channel is None or after.channel.id != call.channel_id:
                # disconnected or moved by someone (or Discord): end this call cleanly
                why = "disconnected from voice" if after.channel is None else "moved to another channel"
                asyncio.get_running_loop().create_task(self.leave(member.guild.id, reason=why))
            return
        if before.channel is not None and before.channel.id == call.channel_id and (
                after.channel is None or after.channel.id != call.channel_id):
            call.transport.forget(member.id)
        self._watch_idle(member.guild, call)

    def humans(self, guild: discord.Guild, channel_id: int) -> int:
        channel = guild.get_channel(channel_id)
        states = getattr(channel, "voice_states", None) or {}
        me = self._client.user.id if self._client.user else None
        count = 0
        for user_id in states:
            member = guild.get_member(user_id)
            if user_id != me and not (member is not None and member.bot):
                count += 1
        return count

    def _watch_idle(self, guild: discord.Guild, call: GuildCall) -> None:
        """Leave once no human has been in the channel for SWITCHBOARD_IDLE_LEAVE_S."""
        alone = self.humans(guild, call.channel_id) == 0
        if not alone:
            if call.idle_timer is not None:
                call.idle_timer.cancel()
                call.idle_timer = None
            return
        if call.idle_timer is None or call.idle_timer.done():
            call.idle_timer = asyncio.get_running_loop().create_task(self._idle_leave(guild, call),
                                                                     name=f"idle-{guild.id}")

    async def _idle_leave(self, guild: discord.Guild, call: GuildCall) -> None:
        await asyncio.sleep(self._idle_leave_s)
        if self._calls.get(guild.id) is not call or self.humans(guild, call.channel_id) > 0:
            return
        await self.leave(guild.id, reason=f"nobody in the channel for {self._idle_leave_s:g} s")
        await self._say(call.text_channel_id, f"Nobody was left in <#{call.channel_id}>, so I left. "
                                              "`/talk join` brings me back.")


    async def _limit_leave(self, guild: discord.Guild, call: GuildCall) -> None:
        """SWITCHBOARD_CALL_MAX_MINUTES: at the limit, say so in the call (when the floor is free, waiting
        at most LIMIT_NOTICE_WAIT_S), leave, and say why in the text channel."""
        minutes = self._max_minutes
        assert minutes is not None
        await asyncio.sleep(minutes * 60)
        if self._calls.get(guild.id) is not call:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(call.engine.announce(
                f"This call has reached its limit of {minutes:g} minutes, so I'm leaving now. "
                "Anyone can ask an operator to start a new one."), LIMIT_NOTICE_WAIT_S)
        await self.leave(guild.id, reason=f"the call limit of {minutes:g} min (SWITCHBOARD_CALL_MAX_MINUTES)")
        await self._say(call.text_channel_id, f"The call in <#{call.channel_id}> reached its limit of {minutes:g} "
                                              "minutes (SWITCHBOARD_CALL_MAX_MINUTES), so I left. `/talk join` starts "
                                              "a new one.")


def _display_name(guild: discord.Guild, user_id: int) -> str | None:
    member = guild.get_member(user_id)
    return member.display_name if member is not None else None
