"""Rejoining, at start, the calls the previous process was in — in the order it happens:

1. `load` (before the gateway opens): every call row not ended (`voice.call.records`: `live` when the
   process died, `resume` when it was stopped for a restart), by server. Calls this process joins later
   are never among them.
2. `resume_guild`, as each server's GUILD_CREATE arrives (`on_guild_available`: its channels and who is in
   voice, without discord.py's READY delay): the call there is rejoined when a human is still in its
   channel — `CallManager.join(…, resume=row)`: the same row, mode and captions, a new provider session
   that starts with the recent turns and their speakers, "I'm back" said once. Otherwise the row is ended
   with why (channel gone, nobody there, a new call already started there, joining failed) and the call
   gets its wrap-up (recap, debrief) — unless its row had ended meanwhile (another process ended it: the
   wrap-up is that process's).
3. `end_unresumable`, once every server READY listed has come: the calls of servers that did not are ended.

The runs service holds finished runs until after step 3, so a run that finished while the process was
down is announced in the rejoined call, then posted (bot.discord.client).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import discord

from bot.discord.calls import CallManager
from voice.call.records import CallRecord, CallRecords

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumeReport:
    """What a resume step did: the rows rejoined, and those ended with why."""

    rejoined: tuple[int, ...] = ()
    ended: tuple[tuple[int, str], ...] = ()


class CallResumer:
    def __init__(self, calls: CallManager, records: Callable[[], CallRecords]) -> None:
        self._calls = calls
        self._records = records  # late-bound: the store arrives with the services
        self._waiting: dict[int, list[CallRecord]] = {}  # by guild: the previous process's calls

    async def load(self) -> int:
        """Step 1: how many calls wait to be rejoined."""
        self._waiting = {}
        for record in await self._records().live():
            self._waiting.setdefault(record.guild_id, []).append(record)
        return sum(len(rows) for rows in self._waiting.values())

    async def resume_guild(self, guild: discord.Guild) -> ResumeReport:
        """Step 2 for one server."""
        rejoined: list[int] = []
        ended: list[tuple[int, str]] = []
        for record in self._waiting.pop(guild.id, []):
            channel = guild.get_channel(record.voice_channel_id)
            why = None
            if not isinstance(channel, discord.VoiceChannel | discord.StageChannel):
                why = "its voice channel is gone"
            elif self._calls.humans(guild, channel.id) == 0:
                why = "nobody was in the channel when Switchboard restarted"
            elif self._calls.active(guild.id):
                why = "a new call had started in that server"
            if why is None:
                assert channel is not None
                try:
                    await self._calls.join(guild, channel, resume=record)
                    rejoined.append(record.id)
                    continue
                except Exception as exc:  # that call cannot come back; the others still can
                    log.warning("call-%s: could not rejoin channel %s: %s", record.id, record.voice_channel_id, exc)
                    why = f"rejoining failed after a restart ({type(exc).__name__})"
            if await self._end(record, why):
                ended.append((record.id, why))
        return ResumeReport(tuple(rejoined), tuple(ended))

    async def end_unresumable(self) -> ResumeReport:
        """Step 3."""
        ended = []
        for rows in self._waiting.values():
            for record in rows:
                why = "its server was not available after the restart"
                if await self._end(record, why):
                    ended.append((record.id, why))
        self._waiting = {}
        return ResumeReport(ended=tuple(ended))

    async def _end(self, record: CallRecord, why: str) -> bool:
        try:
            if not await self._records().end(record.id, why, time.time()):
                log.info("call-%s: had ended already (another process ended it)", record.id)
                return False  # its wrap-up is that process's
        except Exception as exc:
            log.warning("call-%s: could not end its row: %s", record.id, exc)
            return False
        log.info("call-%s: not rejoined: %s", record.id, why)
        self._calls.ended_elsewhere(record.id)
        return True
