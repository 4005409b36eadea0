"""The call resumer's record writes and the call manager's head count, fast: real `CallRecords` over a
SQLite file, discord.py's own `Guild` parsed from the fake Discord's GUILD_CREATE (no gateway), and the
real `CallManager` — only its `join` stands in (joining voice is the real-time rig's job,
tests/bot/discord/test_call_resume.py)."""

from __future__ import annotations

import pytest_asyncio

from bot.discord.calls import CallManager
from bot.discord.gate import OperatorGate
from bot.discord.resume import CallResumer, ResumeReport
from common.store import open_store
from tests.support.offline_guild import OfflineServer
from voice.call.records import MIGRATIONS, CallRecord, CallRecords

NOBODY = "nobody was in the channel when Switchboard restarted"


class Calls(CallManager):
    """The real manager (head count, wrap-ups); `join` records what it was asked, or fails as told."""

    def __init__(self, server: OfflineServer) -> None:
        super().__init__(server.client, runs=_unused, gate=OperatorGate(()), provider=_unused, identity=_unused,
                         on_ended=self._wrapped_up, home_guilds=frozenset())
        self.joined: list[tuple[int, int, CallRecord | None]] = []  # guild, channel, the row resumed
        self.wrapped_up: list[int] = []
        self.join_fails: Exception | None = None

    async def join(self, guild, channel, *, resume=None, **_) -> str:
        if self.join_fails is not None:
            raise self.join_fails
        self.joined.append((guild.id, channel.id, resume))
        return "joined"

    def active(self, guild_id: int) -> bool:
        return any(g == guild_id for g, _, resume in self.joined if resume is None)  # a call /talk join started

    def _wrapped_up(self, record_id: int, call):
        self.wrapped_up.append(record_id)  # when it is asked for, not when its task runs
        return _nothing()


async def _nothing() -> None:
    pass


def _unused(*_):
    raise AssertionError("not used by the resumer")


@pytest_asyncio.fixture
async def records(tmp_path):
    store = await open_store(tmp_path, MIGRATIONS)
    try:
        yield CallRecords(store)
    finally:
        await store.close()


async def a_call(records: CallRecords, server: OfflineServer, *, channel_id: int | None = None) -> int:
    return await records.start(guild_id=server.world.id, voice_channel_id=channel_id or server.voice_channel_id,
                               text_channel_id=server.world.text_channel.id, started_by=None, mode="everyone",
                               captions=False, at=100.0)


async def test_bots_are_not_people_so_a_channel_of_bots_is_not_rejoined_and_its_call_ends(records):
    server = OfflineServer()
    calls = Calls(server)
    server.in_voice(server.bot, server.member("musicbot", bot=True))
    assert calls.humans(server.guild(), server.voice_channel_id) == 0
    call_id = await a_call(records, server)
    resumer = CallResumer(calls, lambda: records)
    assert await resumer.load() == 1
    report = await resumer.resume_guild(server.guild())
    assert report.rejoined == () and report.ended == ((call_id, NOBODY),) and calls.joined == []
    row = await records.get(call_id)
    assert (row.state, row.end_reason) == ("ended", NOBODY) and row.ended_at is not None
    assert calls.wrapped_up == [call_id]  # its recap and debrief
    olive = server.member("olive")
    server.in_voice(olive)
    assert calls.humans(server.guild(), server.voice_channel_id) == 1  # the person, not the two bots


async def test_a_call_with_a_person_in_its_channel_is_rejoined_on_its_own_row_and_left_live(records):
    server = OfflineServer()
    calls = Calls(server)
    server.in_voice(server.bot, server.member("olive"))
    call_id = await a_call(records, server)
    assert await records.mark_resume(call_id)  # a deploy stopped the process
    resumer = CallResumer(calls, lambda: records)
    await resumer.load()
    report = await resumer.resume_guild(server.guild())
    assert report.rejoined == (call_id,) and report.ended == ()
    ((guild_id, channel_id, resumed),) = calls.joined
    assert (guild_id, channel_id, resumed.id, resumed.state) == (server.world.id, server.voice_channel_id, call_id,
                                                                 "resume")
    assert (await records.get(call_id)).state == "resume"  # the manager's join makes it live, not the resumer
    assert calls.wrapped_up == [] and await resumer.end_unresumable() == ResumeReport()


async def test_calls_that_cannot_come_back_are_ended_each_with_why(records):
    here = OfflineServer()
    gone = OfflineServer(here.ids)  # another server
    calls = Calls(here)
    here.in_voice(here.member("olive"))
    deleted = await a_call(records, here, channel_id=here.ids())  # its voice channel was deleted
    failing = await a_call(records, here)
    elsewhere = await a_call(records, gone)  # a server that never came back
    resumer = CallResumer(calls, lambda: records)
    assert await resumer.load() == 3
    calls.join_fails = ConnectionError("voice handshake timed out")
    report = await resumer.resume_guild(here.guild())
    failed = "rejoining failed after a restart (ConnectionError)"
    assert report.ended == ((deleted, "its voice channel is gone"), (failing, failed))
    later = await resumer.end_unresumable()
    assert later.ended == ((elsewhere, "its server was not available after the restart"),)
    reasons = {r: (await records.get(r)).end_reason for r in (deleted, failing, elsewhere)}
    assert reasons == {deleted: "its voice channel is gone", failing: failed,
                       elsewhere: "its server was not available after the restart"}
    assert sorted(calls.wrapped_up) == sorted(reasons) and await records.live() == []


async def test_a_call_ended_meanwhile_is_not_ended_again_nor_wrapped_up_twice(records):
    server = OfflineServer()
    calls = Calls(server)
    call_id = await a_call(records, server)
    resumer = CallResumer(calls, lambda: records)
    await resumer.load()
    await records.end(call_id, "left on /talk leave", 150.0)  # e.g. by another process, after the load
    report = await resumer.resume_guild(server.guild())  # nobody in its channel now
    assert report.ended == () and calls.wrapped_up == []
    assert (await records.get(call_id)).end_reason == "left on /talk leave"


async def test_a_new_call_in_the_server_keeps_the_old_row_from_being_rejoined(records):
    server = OfflineServer()
    calls = Calls(server)
    server.in_voice(server.member("olive"))
    call_id = await a_call(records, server)
    resumer = CallResumer(calls, lambda: records)
    await resumer.load()
    await calls.join(server.guild(), server.guild().get_channel(server.voice_channel_id))  # /talk join, first
    report = await resumer.resume_guild(server.guild())
    assert report.ended == ((call_id, "a new call had started in that server"),) and len(calls.joined) == 1
