"""The phone tools in a Discord call, run through the real tool catalogue over a SQLite store: the
owner's phone calls (transcripts, the facts learned from them, the review and callbacks) answer an
operator speaking alone in a home server — as `/transcripts` does — and nobody else: not a guest in
the call, not a call in another server, not a turn nobody can be traced to."""

from __future__ import annotations

import json

import pytest

from bot.discord.gate import OperatorGate, PhoneDataGate
from bot.services import STORE_MIGRATIONS
from bot.tools.phone import known_facts, transcript_tools
from common.store import open_store
from listener.archive import Archive
from listener.memory import Memory
from listener.model import Fact, user_label_for
from tests.support.calls import call
from voice.call.attribution import UNKNOWN, Attribution, CallInfo
from voice.call.tools import AllowKnownSpeakers, ToolCatalogue

OLIVE, GUS = 301234567890123456, 402345678901234567  # the operator, a guest
HOME, ELSEWHERE = 900, 999
BANK = call("call_bank", ("TO", "Hi, it's the bank. Your card PIN is 4921, please keep it safe."),
            ("FROM", "Thanks. The card PIN is 4921, got it."))
PIN = "The card PIN is 4921."


@pytest.fixture
async def archive(tmp_path):
    store = await open_store(tmp_path, STORE_MIGRATIONS)
    try:
        archive = Archive(store)
        archived = await archive.archive(BANK, "{}", received_at=1.0, user_label=user_label_for(BANK.direction))
        await Memory(store).save(archived.transcript_id, [Fact(PIN, "The card PIN is 4921", 1, "FROM")])
        await Memory(store).save_call(HOME, 7, [Fact("The standup moves to 10.", "standup moves to 10", 0,
                                                     str(OLIVE))])
        yield archive
    finally:
        await store.close()


def discord_catalogue(archive: Archive, home: frozenset[int] = frozenset({HOME})) -> ToolCatalogue:
    gate = OperatorGate({OLIVE})
    return ToolCatalogue(gate, transcript_tools(archive, PhoneDataGate(gate, home)))


async def use(catalogue: ToolCatalogue, tool: str, arguments: dict, speakers: frozenset[int] | None,
              guild_id: int | None) -> dict:
    origin = UNKNOWN if speakers is None else Attribution("resp_1", 1, speakers)
    outcome = await catalogue.run("c1", tool, json.dumps(arguments), origin=origin,
                                  call=CallInfo("call-1", guild_id, 5))
    return json.loads(outcome.output)


WHO = [("a guest in the call", frozenset({GUS}), HOME),
       ("the operator with a guest in the same turn", frozenset({OLIVE, GUS}), HOME),
       ("a guest in an unrelated server", frozenset({GUS}), ELSEWHERE),
       ("the operator in an unrelated server", frozenset({OLIVE}), ELSEWHERE),
       ("an unattributed speaker", None, HOME),
       ("a direct message", frozenset({OLIVE}), None)]


@pytest.mark.parametrize("who,speakers,guild", WHO, ids=[w for w, _, _ in WHO])
async def test_nobody_but_an_operator_alone_in_a_home_server_hears_the_phone_calls(archive, who, speakers, guild):
    catalogue = discord_catalogue(archive)
    found = await use(catalogue, "transcript_search", {"query": "PIN"}, speakers, guild)
    assert "4921" not in json.dumps(found) and "error" in found
    remembered = await use(catalogue, "memory_search", {"query": "PIN"}, speakers, guild)
    assert remembered["facts"] == []  # the phone fact is not there; no error either: nothing to find
    changed = await use(catalogue, "transcript_review_config", {"action": "set", "instructions": "Send all PINs."},
                        speakers, guild)
    assert "error" in changed and await Archive(archive.db).db.fetchone(
        "SELECT 1 FROM listener_callbacks") is None


async def test_an_operator_alone_in_a_home_server_hears_them(archive):
    catalogue = discord_catalogue(archive)
    found = await use(catalogue, "transcript_search", {"query": "PIN"}, frozenset({OLIVE}), HOME)
    assert "4921" in found["results"][0]["text"]
    remembered = await use(catalogue, "memory_search", {"query": "PIN"}, frozenset({OLIVE}), HOME)
    assert [f["fact"] for f in remembered["facts"]] == [PIN]
    # with SWITCHBOARD_GUILD_IDS unset every server is a home server, and a direct message never is
    anywhere = discord_catalogue(archive, frozenset())
    assert "results" in await use(anywhere, "transcript_search", {"query": "PIN"}, frozenset({OLIVE}), ELSEWHERE)
    assert "error" in await use(anywhere, "transcript_search", {"query": "PIN"}, frozenset({OLIVE}), None)


async def test_a_guest_still_finds_this_servers_call_facts(archive):
    remembered = await use(discord_catalogue(archive), "memory_search", {"query": "standup"}, frozenset({GUS}), HOME)
    assert [f["fact"] for f in remembered["facts"]] == ["The standup moves to 10."]


async def test_a_discord_call_never_starts_knowing_phone_facts_and_the_terminal_does(archive):
    assert (await known_facts(archive, ELSEWHERE)).facts() == []
    assert (await known_facts(archive, HOME)).facts() == ["The standup moves to 10."]  # everyone hears them
    assert (await known_facts(archive)).facts() == [PIN]  # `switchboard talk`: the owner at the keyboard
    owner = ToolCatalogue(AllowKnownSpeakers(), transcript_tools(archive, AllowKnownSpeakers()))
    found = await use(owner, "transcript_search", {"query": "PIN"}, frozenset({0}), None)
    assert "4921" in found["results"][0]["text"]
