"""A Discord call's row in the store (`voice.call.records`), written as the call goes, in the order it
happens:

1. `open_row`: at join, a new `live` row, or the resumed one made `live` again (a row that has ended is
   never revived: the call gets a new one);
2. `CallRow.add_turn`: every line of the conversation, each in a task of its own; a person's turn also
   writes the call's totals;
3. `CallRow.totals_changed`: the totals (how long each person spoke, what the provider reported) as each
   response or transcription is reported — one write in flight, the newest totals win
   (`common.latest_write`) — so a crash right after an answer loses none of its usage;
4. `CallRow.close`: once the call's last turns are written, the totals, then `ended` with why, or
   `resume` when the process is stopping.

Nothing here raises into the call: a failing store is logged once per call and the call goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from common.latest_write import LatestWrite
from voice.call.records import CallRecord, CallRecords
from voice.call.usage import CallUsage

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 8.0  # at leave, the turns still on their way to the store get this long
Totals = Callable[[], tuple[Mapping[int, int], CallUsage]]  # how long each person spoke, and the usage


async def open_row(records: CallRecords, *, guild_id: int, channel_id: int, text_channel_id: int | None,
                   requested_by: int | None, mode: str, captions: bool, started_at: float,
                   resume: CallRecord | None) -> int | None:
    """The call's row id: the resumed one made live again, else a new one; None when the store would not
    take it (the call goes on unrecorded, logged)."""
    try:
        if resume is not None and await records.mark_live(resume.id):
            return resume.id
        return await records.start(guild_id=guild_id, voice_channel_id=channel_id, text_channel_id=text_channel_id,
                                   started_by=requested_by, mode=mode, captions=captions, at=started_at)
    except Exception as exc:
        log.warning("guild %s: could not record the call in the store (the call goes on): %s", guild_id, exc)
        return None


class CallRow:
    def __init__(self, records: CallRecords, record_id: int, totals: Totals, *, call_id: str) -> None:
        self.records = records
        self.record_id = record_id
        self._totals = totals  # read when a write starts: always the newest
        self._call_id = call_id
        self._turns: set[asyncio.Task] = set()  # turns on their way to the store
        self._failed = False  # said once per call
        self._totals_write = LatestWrite(self._write_totals, self._failure, name=f"{call_id}-totals")

    def add_turn(self, role: str, speaker: int | None, name: str, text: str, at: float) -> None:
        """Append a line of the conversation (in the background); a person's turn also writes the totals."""
        task = asyncio.get_running_loop().create_task(
            self._add_turn(role, speaker, name, text, at),
            name=f"{self._call_id}-turn")
        self._turns.add(task)
        task.add_done_callback(self._turns.discard)

    def totals_changed(self) -> None:
        """The provider reported usage (or someone spoke): write the totals soon."""
        self._totals_write.request()

    async def written(self, timeout: float = CLOSE_WAIT_S) -> None:
        """Wait until the turns and totals asked for so far are in the store (the turns at most `timeout` s)."""
        if self._turns:
            await asyncio.wait(set(self._turns), timeout=timeout)
        await self._totals_write.settled()

    async def close(self, reason: str, *, resume: bool) -> None:
        """After the call's last turns and totals: `ended` with why, or `resume` (the process is stopping)."""
        await self.written()
        try:
            await self._write_totals()
            if resume:
                await self.records.mark_resume(self.record_id)
            else:
                await self.records.end(self.record_id, reason, time.time())
        except Exception as exc:
            self._failure(exc)

    async def _add_turn(self, role: str, speaker: int | None, name: str, text: str, at: float) -> None:
        try:
            await self.records.add_turn(self.record_id, role, speaker, name, text, at)
        except Exception as exc:
            self._failure(exc)
            return
        if role == "user":
            self.totals_changed()

    async def _write_totals(self) -> None:
        spoken_ms, usage = self._totals()
        await self.records.set_totals(self.record_id, spoken_ms, usage)

    def _failure(self, exc: Exception) -> None:
        if not self._failed:
            self._failed = True
            log.warning("call %s: could not record it in the store (the call goes on): %s", self._call_id, exc)
