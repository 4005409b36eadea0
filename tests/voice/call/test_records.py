"""Durable call rows (`voice.call.records`) over a real SQLite store in tmp_path."""

from __future__ import annotations

import pytest
import pytest_asyncio

from common.store import Store, open_store
from voice.call.records import KEEP_TURNS, MIGRATIONS, CallRecords
from voice.call.usage import CallUsage


@pytest_asyncio.fixture
async def store(tmp_path, database_url):
    store = await open_store(tmp_path, MIGRATIONS, database_url=database_url)
    try:
        yield store
    finally:
        await store.close()


async def start(records: CallRecords, guild_id: int = 1, at: float = 100.0) -> int:
    return await records.start(guild_id=guild_id, voice_channel_id=20, text_channel_id=30, started_by=40,
                               mode="everyone", captions=True, at=at)


@pytest.mark.asyncio
async def test_a_call_is_started_given_turns_and_ended_and_a_reopened_store_sees_it(tmp_path, database_url):
    store = await open_store(tmp_path, MIGRATIONS, database_url=database_url)
    try:
        records = CallRecords(store)
        call_id = await start(records)
        await records.add_turn(call_id, "user", 40, "Olive", "audit the auth module", 101.0)
        await records.add_turn(call_id, "assistant", None, "Ares", "On it.", 102.0)
        (live,) = await records.live()
        assert (live.id, live.guild_id, live.voice_channel_id, live.text_channel_id, live.started_by) == \
            (call_id, 1, 20, 30, 40)
        assert (live.mode, live.captions, live.started_at, live.state, live.ended_at) == \
            ("everyone", True, 100.0, "live", None)
        assert [(t.seq, t.role, t.speaker_id, t.name, t.text) for t in live.turns] == [
            (1, "user", 40, "Olive", "audit the auth module"), (2, "assistant", None, "Ares", "On it.")]
        assert await records.end(call_id, "left on /talk leave", 200.0)
        assert not await records.end(call_id, "again", 300.0)  # ended once
        assert await records.live() == []
        with pytest.raises(ValueError):
            await records.add_turn(call_id, "system", None, "x", "y", 1.0)
    finally:
        await store.close()
    again = await open_store(tmp_path, MIGRATIONS, database_url=database_url)  # another process, as it were: a fresh open of the file
    try:
        ended = await CallRecords(again).get(call_id)
        assert ended is not None
        assert (ended.state, ended.ended_at, ended.end_reason) == ("ended", 200.0, "left on /talk leave")
        assert [t.text for t in ended.turns] == ["audit the auth module", "On it."]
    finally:
        await again.close()


@pytest.mark.asyncio
async def test_only_the_newest_turns_are_kept_per_call(store: Store):
    records = CallRecords(store)
    busy, quiet = await start(records, guild_id=1), await start(records, guild_id=2)
    await records.add_turn(quiet, "user", 7, "Gus", "hello", 1.0)
    for n in range(KEEP_TURNS + 7):
        await records.add_turn(busy, "user", 40, "Olive", f"line {n}", float(n))
    calls = {c.guild_id: c for c in await records.live()}
    kept = calls[1].turns
    assert len(kept) == KEEP_TURNS == 500
    assert [t.text for t in kept] == [f"line {n}" for n in range(7, KEEP_TURNS + 7)]  # oldest first
    assert kept[-1].seq == KEEP_TURNS + 7
    assert [t.text for t in calls[2].turns] == ["hello"]  # another call's turns are its own
    rows = await store.fetchone("SELECT COUNT(*) FROM voice_call_turns")
    assert rows[0] == KEEP_TURNS + 1


@pytest.mark.asyncio
async def test_ended_resume_and_live_calls(store: Store):
    records = CallRecords(store)
    left, deploy, crash = [await start(records, guild_id=g) for g in (1, 2, 3)]
    await records.end(left, "nobody in the channel", 10.0)
    assert await records.mark_resume(deploy)
    assert not await records.mark_resume(left)  # an ended call stays ended
    assert not await records.mark_live(left) and (await records.get(left)).state == "ended"  # never revived
    assert await records.mark_live(crash)  # rejoining a live (crashed) call keeps it live
    live = await records.live()
    assert [(c.id, c.state, c.ended_at) for c in live] == [(deploy, "resume", None), (crash, "live", None)]
    assert [c.id for c in await records.live(guild_id=3)] == [crash]
    assert await records.end(deploy, "rejoined nobody", 20.0)  # a call to resume can still end
    assert [c.id for c in await records.live()] == [crash]


async def test_speaking_times_and_usage_are_totals_kept_with_the_call(tmp_path, database_url):
    store = await open_store(tmp_path, MIGRATIONS, database_url=database_url)
    records = CallRecords(store)
    call_id = await records.start(guild_id=1, voice_channel_id=2, text_channel_id=None, started_by=3, mode="everyone",
                                  captions=False, at=10.0)
    assert (await records.get(call_id)).spoken_ms == {} and not (await records.get(call_id)).usage.reported
    used = CallUsage(responses=2, input_tokens=900, input_audio=800, output_tokens=300, output_audio=250,
                     transcription_seconds=4.5)
    await records.set_totals(call_id, {3: 1200, None: 500, 4: 300}, used)
    await records.set_totals(call_id, {3: 2500}, used + used)  # totals replace, people not named stay
    record = await records.get(call_id)
    assert record.spoken_ms == {3: 2500, 4: 300}  # an unattributed stretch has nobody to count for
    assert record.usage == used + used
    (live,) = await records.live()
    assert live.spoken_ms == record.spoken_ms and live.usage == record.usage
    await store.close()


def test_a_stored_usage_that_is_not_what_to_json_wrote_counts_as_nothing():
    assert CallUsage.from_json({"responses": "2", "input_tokens": -1, "transcription_seconds": float("nan"),
                                "output_tokens": True}) == CallUsage()
    assert CallUsage.from_json(None) == CallUsage()
    used = CallUsage(responses=1, output_tokens=5, transcription_seconds=1.25)
    assert CallUsage.from_json(used.to_json()) == used
