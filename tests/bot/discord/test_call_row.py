"""The call manager's record writes (`bot.discord.call_row`) over a real SQLite file: the row opened at
join (a resumed one goes on, an ended one is never revived), each turn, the totals as usage is reported,
and the end — read back through a second connection, as the next process would after a kill -9."""

from __future__ import annotations

import logging

import pytest_asyncio

from bot.discord.call_row import CallRow, open_row
from common.store import open_store
from voice.call.records import MIGRATIONS, CallRecords
from voice.call.usage import NO_USAGE, CallUsage

OLIVE = 4001
HEARD = {"type": "tokens", "input_tokens": 40, "output_tokens": 9, "input_token_details": {"audio_tokens": 40}}
ANSWER = {"input_tokens": 693, "output_tokens": 46, "input_token_details": {"text_tokens": 600, "audio_tokens": 93},
          "output_token_details": {"text_tokens": 10, "audio_tokens": 36}}  # the answer the issue lost


class Totals:
    """What a `GuildCall` reports: how long each person spoke, and the usage so far."""

    def __init__(self) -> None:
        self.spoken: dict[int, int] = {}
        self.usage: CallUsage = NO_USAGE

    def __call__(self) -> tuple[dict[int, int], CallUsage]:
        return dict(self.spoken), self.usage


@pytest_asyncio.fixture
async def records(tmp_path):
    store = await open_store(tmp_path, MIGRATIONS)
    try:
        yield CallRecords(store)
    finally:
        await store.close()


async def reopened(tmp_path, call_id: int):
    """The row as another process reads the file (nothing of this one's connection shared)."""
    store = await open_store(tmp_path, MIGRATIONS)
    try:
        return await CallRecords(store).get(call_id)
    finally:
        await store.close()


async def opened(records: CallRecords, resume=None) -> int | None:
    return await open_row(records, guild_id=1, channel_id=20, text_channel_id=30, requested_by=OLIVE,
                          mode="everyone", captions=False, started_at=100.0, resume=resume)


async def test_a_new_call_gets_a_row_a_stopped_one_goes_on_in_its_own_and_an_ended_one_is_never_revived(records):
    first = await opened(records)
    assert (await records.get(first)).state == "live"
    assert await records.mark_resume(first)  # a deploy stopped the process during the call
    stopped = await records.get(first)
    assert await opened(records, resume=stopped) == first and (await records.get(first)).state == "live"
    await records.end(first, "nobody in the channel", 200.0)  # e.g. ended by the process that rejoined it
    again = await opened(records, resume=stopped)  # a stale row to resume: the call starts a row of its own
    assert again not in (None, first)
    ended = await records.get(first)
    assert (ended.state, ended.end_reason) == ("ended", "nobody in the channel")
    assert (await records.get(again)).state == "live"


async def test_an_answers_usage_is_in_the_row_as_soon_as_it_is_reported_so_a_kill_after_it_loses_nothing(
        records, tmp_path):
    totals = Totals()
    call_id = await opened(records)
    row = CallRow(records, call_id, totals, call_id=f"call-{call_id}")
    totals.spoken, totals.usage = {OLIVE: 1800}, NO_USAGE.add_transcription(HEARD)
    row.add_turn("user", OLIVE, "Olive", "what is on today", 101.0)  # a person's turn writes the totals
    await row.written()
    assert (await reopened(tmp_path, call_id)).usage == totals.usage
    totals.usage = totals.usage.add_response(ANSWER)  # the answer's response.done, after the last turn
    row.totals_changed()
    await row.written()
    # killed here (no leave, no close): the next process reads the answer's usage from the row
    crashed = await reopened(tmp_path, call_id)
    assert crashed.state == "live" and crashed.spoken_ms == {OLIVE: 1800}
    assert (crashed.usage.input_tokens, crashed.usage.output_tokens, crashed.usage.responses) == (693, 46, 1)
    assert crashed.usage == NO_USAGE.add_transcription(HEARD).add_response(ANSWER)


async def test_turns_go_in_order_and_close_writes_the_last_totals_then_ends_or_marks_resume(records, tmp_path):
    totals = Totals()
    left, stopped = await opened(records), await opened(records)
    for call_id, resume in ((left, False), (stopped, True)):
        row = CallRow(records, call_id, totals, call_id=f"call-{call_id}")
        row.add_turn("user", OLIVE, "Olive", "book room four", 101.0)
        row.add_turn("assistant", None, "Ares", "Booked.", 102.0)
        totals.spoken, totals.usage = {OLIVE: 2500}, NO_USAGE.add_response(ANSWER)  # reported, never written yet
        await row.close("left on /talk leave", resume=resume)
        record = await reopened(tmp_path, call_id)
        assert [(t.role, t.speaker_id, t.name, t.text) for t in record.turns] == [
            ("user", OLIVE, "Olive", "book room four"), ("assistant", None, "Ares", "Booked.")]
        assert record.spoken_ms == {OLIVE: 2500} and record.usage == totals.usage
        assert (record.state, record.end_reason) == (("resume", None) if resume else ("ended", "left on /talk leave"))
        totals = Totals()


async def test_a_store_that_fails_is_logged_once_per_call_and_never_raises_into_it(records, caplog):
    call_id = await opened(records)
    row = CallRow(records, call_id, Totals(), call_id=f"call-{call_id}")
    await records.store.close()  # every write fails from here on
    row.add_turn("user", OLIVE, "Olive", "hello", 101.0)
    row.totals_changed()
    await row.written()
    await row.close("left", resume=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"call call-{call_id}: could not record it in the store" in warnings[0]
