"""When a Discord call ends for good — `/talk leave`, an empty channel, the call limit, a disconnect, or a
restart that found its channel empty — in the order it happens:

1. the call's row (`voice.call.records`: when, who started it, its last turns, who spoke for how long
   and what the provider reported — before and after any restart);
2. the runs it started (`RunService.tickets_of("call-<row id>")`: the id outlives restarts with the row);
3. a summary of what was discussed and decided: one structured request to the text model
   (`voice.call.summary`), bounded by `SUMMARY_TIMEOUT_S` and cut short when the process stops (`hurry`);
   without a model, or when it fails, the recap says the summary is unavailable — it is never lost;
4. the recap embed (`bot.discord.recap`) posted in the channel `/talk join` was used in, and in the
   call's captions thread when it had one (a failed post is logged with what to fix);
5. the debrief (`bot.discord.debrief`): what operators stated or confirmed becomes memory, under the
   phone calls' evidence rules.

Nothing here raises into the call manager: each step's failure is logged and the next step runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import discord

from bot.discord.calls import GuildCall
from bot.discord.debrief import debrief_call
from bot.discord.posts import PostError, send
from bot.discord.recap import recap_embed, recap_of
from common.text_model import TextModel, TextModelError
from runs import RunService
from voice.call.records import CallRecord, CallRecords
from voice.call.summary import CallSummary, parse_summary, summary_request

log = logging.getLogger(__name__)

SUMMARY_TIMEOUT_S = 30.0
NO_MODEL = "no text model is configured"


class CallWrapUp:
    """The `CallManager`'s `on_ended`: recap, then debrief. `model` None: no summary, no debrief (the recap
    says so); `records`/`runs` are late-bound (the store arrives with the services)."""

    def __init__(self, client: discord.Client, *, records: Callable[[], CallRecords], runs: Callable[[], RunService],
                 model: Callable[[], TextModel | None], operators: frozenset[int]) -> None:
        self._client = client
        self._records = records
        self._runs = runs
        self._model = model
        self._operators = operators
        self._hurry = asyncio.Event()

    def hurry(self) -> None:
        """The process is stopping: recaps still waiting for their summary are posted without one now."""
        self._hurry.set()

    async def __call__(self, record_id: int, call: GuildCall | None) -> None:
        try:
            record = await self._records().get(record_id)
        except Exception as exc:
            log.warning("call-%s: no recap: its row could not be read: %s", record_id, exc)
            return
        if record is None:
            return
        thread = call.captions.thread if call is not None and call.captions is not None else None
        await self.post_recap(record, names=_names(call), thread_id=thread.id if thread is not None else None)
        if not self._hurry.is_set():  # a debrief cut short learns nothing; the next start does not redo it
            await self.debrief(record)

    async def post_recap(self, record: CallRecord, *, names: dict[int, str] | None = None,
                         thread_id: int | None = None) -> None:
        """Post the call's recap where `/talk join` was used and in its captions thread (`thread_id`);
        `names`: display names as the channel shows them now (else the names its turns carried)."""
        try:
            runs = await self._runs().tickets_of(f"call-{record.id}")
        except Exception as exc:
            log.warning("call-%s: the recap lists no runs: %s", record.id, exc)
            runs = []
        summary, note = await self._summary(record)
        recap = recap_of(record, spoken_ms=record.spoken_ms,
                         names=names, runs=runs, usage=record.usage if record.usage.reported else None,
                         summary=summary, summary_note=note, ended_at=record.ended_at or time.time())
        embed = recap_embed(recap)
        for channel_id in [record.text_channel_id] + ([thread_id] if thread_id is not None else []):
            if channel_id is None:
                log.info("call-%s: recap not posted: /talk join was not used in a text channel", record.id)
                continue
            try:
                await send(self._client, channel_id, embed=embed)
            except PostError as exc:
                log.warning("call-%s: the recap was not posted: %s", record.id, exc)

    async def _summary(self, record: CallRecord) -> tuple[CallSummary | None, str | None]:
        request = summary_request(record.turns)
        if request is None:
            return None, "nobody said anything the recap could sum up"
        model = self._model()
        if model is None:
            return None, NO_MODEL
        if self._hurry.is_set():
            return None, "Switchboard was shutting down"
        asking = asyncio.ensure_future(model.structured(request.messages, request.name, request.schema))
        hurry = asyncio.ensure_future(self._hurry.wait())
        try:
            await asyncio.wait({asking, hurry}, timeout=SUMMARY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurry.cancel()
        if not asking.done():
            asking.cancel()
            await asyncio.gather(asking, return_exceptions=True)
            return None, ("Switchboard was shutting down" if self._hurry.is_set()
                          else "the text model did not answer in time")
        try:
            answer = asking.result()
        except TextModelError as exc:
            log.warning("call-%s: no summary: %s", record.id, exc)
            return None, "the text model could not be reached"
        summary = parse_summary(answer)
        return (summary, None) if summary is not None else (None, "the text model's answer was not usable")

    async def debrief(self, record: CallRecord) -> None:
        model = self._model()
        if model is None:
            return
        try:
            result = await debrief_call(record, operators=self._operators, model=model, store=self._runs().store)
        except Exception:
            log.exception("call-%s: the debrief failed", record.id)
            return
        log.info("debrief %s", result.summary)


def _names(call: GuildCall | None) -> dict[int, str]:
    """Display names as the channel shows them now, for members still there."""
    if call is None:
        return {}
    guild = call.voice.guild
    names = {}
    for user_id in call.spoken_ms():
        member = guild.get_member(user_id) if user_id is not None else None
        if member is not None:
            names[user_id] = member.display_name
    return names
