"""The call archive on both engines (a real SQLite file, a real PostgreSQL database): idempotent archiving, FTS5 search that cannot be steered
by the query's syntax, filters, pagination that never truncates silently, and the CLI over it."""

from __future__ import annotations

import argparse
import io
import json
import re
import sqlite3

import pytest

from bot.cli.transcripts import add_parser, main
from bot.services import LISTENER_MIGRATIONS
from bot.settings import check_settings
from common.store import DB_FILENAME, open_store
from listener.archive import SOURCE_TRUST, Archive, ArchiveError, fts_query
from listener.model import user_label_for
from tests.support.calls import call
from tests.support.postgres import store_env

DENTIST = call("call_1", ("TO", "Column's scheduling, this is Erica."),
               ("FROM", "Hi, I'd like to move my dentist appointment to Tuesday."),
               ("TO", "Tuesday at nine works. Anything else?"))
PLUMBER = call("call_2", ("FROM", "Ares, add the plumber visit on Friday to my calendar."),
               ("TO", "Sure, the plumber comes Friday."), direction="outbound", frm="+15550002", to="+15550003")


@pytest.fixture
async def archive(tmp_path, database_url):
    store = await open_store(tmp_path, LISTENER_MIGRATIONS, database_url=database_url)
    calls = Archive(store)
    for transcript in (DENTIST, PLUMBER):
        await calls.archive(transcript, json.dumps({"conversation_id": transcript.conversation_id}),
                            received_at=1_750_000_000.0 + len(transcript.conversation_id),
                            user_label=user_label_for(transcript.direction))
    yield calls
    await store.close()


async def test_a_replayed_call_is_not_archived_twice(archive):
    again = await archive.archive(DENTIST, "{}", received_at=1.0, user_label="TO")
    assert again.created is False
    assert (await archive.db.fetchone("SELECT COUNT(*) FROM transcripts"))[0] == 2
    assert (await archive.db.fetchone("SELECT COUNT(*) FROM transcript_turns"))[0] == 5


async def test_search_finds_turns_with_all_the_words_and_marks_them_untrusted(archive):
    found = await archive.search("dentist Tuesday")
    assert found["source_trust"] == SOURCE_TRUST == "external-untrusted"
    assert [(r["conversation_id"], r["turn_index"]) for r in found["results"]] == [("call_1", 1)]
    assert found["results"][0]["speaker"] == "FROM" and found["results"][0]["is_user"] is False  # inbound: TO is you
    assert (await archive.search("dentist plumber"))["results"] == []


@pytest.mark.parametrize(("hostile", "expected"), [
    ('text:"x" OR 1', 0), ("plumber) OR (dentist", 0), ("NEAR(plumber calendar)", 0), ("plumber*", 2),
    ('"unbalanced', 0), ("-dentist", 1), ("^plumber", 2), ("dentist OR plumber", 0)])
async def test_the_query_is_words_never_fts5_syntax(archive, hostile, expected):
    """Operators, columns, prefixes and quotes are taken as words: every result holds every word."""
    found = await archive.search(hostile)  # never an SQL or FTS5 syntax error
    words = {w.lower() for w in re.findall(r"\w+", hostile)}
    assert len(found["results"]) == expected
    for r in found["results"]:
        assert words <= {w.lower() for w in re.findall(r"\w+", r["text"])}


def test_fts_query_quotes_every_word_and_refuses_an_empty_search():
    assert fts_query('plumber) OR "x') == '"plumber" "OR" "x"'
    with pytest.raises(ArchiveError, match="no words"):
        fts_query("  ?! ")


async def test_filters_narrow_by_call_speaker_direction_number_and_user(archive):
    assert len((await archive.search("Tuesday"))["results"]) == 2
    assert [r["turn_index"] for r in (await archive.search("Tuesday", speaker="TO"))["results"]] == [2]
    assert (await archive.search("plumber", direction="inbound"))["results"] == []
    assert len((await archive.search("plumber", number="+15550003"))["results"]) == 2
    mine = (await archive.search("plumber", user_only=True))["results"]
    assert [(r["speaker"], r["is_user"]) for r in mine] == [("FROM", True)]  # outbound: FROM is you
    assert (await archive.search("Tuesday", conversation_id="call_2"))["results"] == []


async def test_pages_say_where_the_next_one_starts_and_the_last_says_none(archive):
    first = await archive.search("Tuesday", limit=1)
    second = await archive.search("Tuesday", limit=1, offset=first["next_offset"])
    assert first["next_offset"] == 1 and second["next_offset"] is None
    assert {r["turn_index"] for r in first["results"] + second["results"]} == {1, 2}
    with pytest.raises(ArchiveError, match="limit"):
        await archive.search("Tuesday", limit=0)


async def test_show_by_archive_id_or_conversation_id(archive):
    by_id = await archive.show(1)
    assert by_id == await archive.show("call_1")
    assert [t["speaker"] for t in by_id["turns"]] == ["TO", "FROM", "TO"] and by_id["source_trust"] == SOURCE_TRUST
    with pytest.raises(ArchiveError, match="no archived call 'nope'"):
        await archive.show("nope")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="switchboard")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["transcripts", *argv])


async def test_the_cli_searches_and_shows_with_json_and_says_what_to_do(archive, tmp_path, database_url):
    settings = check_settings(store_env(tmp_path, database_url)).settings
    out, err = io.StringIO(), io.StringIO()
    assert await main(parse("search", "plumber", "--json"), settings, out=out, err=err) == 0
    data = json.loads(out.getvalue())
    assert data["source_trust"] == "external-untrusted" and len(data["results"]) == 2
    out = io.StringIO()
    assert await main(parse("show", "call_2"), settings, out=out, err=err) == 0
    assert "untrusted" in out.getvalue() and "FROM (you): Ares, add the plumber visit" in out.getvalue()
    out = io.StringIO()
    assert await main(parse("search", "plumber", "--since", "2999-01-01", "--json"), settings, out=out, err=err) == 0
    assert json.loads(out.getvalue())["results"] == []  # every call here was received before that day
    out = io.StringIO()
    assert await main(parse("search", "plumber", "--since", "2025-06-01", "--until", "2025-07-01", "--json"), settings,
                      out=out, err=err) == 0
    assert len(json.loads(out.getvalue())["results"]) == 2  # mid-June 2025
    with pytest.raises(SystemExit):
        parse("search", "plumber", "--until", "yesterday")
    err = io.StringIO()
    assert await main(parse("show", "404"), settings, out=io.StringIO(), err=err) == 2
    assert err.getvalue().startswith("switchboard transcripts: no archived call '404'")


async def test_the_full_text_index_matches_the_turns_after_archiving_editing_and_deleting(archive, tmp_path):
    def integrity() -> None:  # FTS5 raises "database disk image is malformed" when the index disagrees
        if archive.db.engine != "sqlite":
            return  # PostgreSQL's index is a generated column: it cannot disagree
        with sqlite3.connect(tmp_path / DB_FILENAME) as db:
            db.execute("INSERT INTO transcript_turns_fts (transcript_turns_fts, rank) VALUES ('integrity-check', 1)")

    integrity()
    async with archive.db.transaction() as conn:
        await conn.execute("UPDATE transcript_turns SET text = 'the boiler is leaking' WHERE turn_index = 0 "
                           "AND transcript_id = 2")
    integrity()
    assert [r["conversation_id"] for r in (await archive.search("boiler"))["results"]] == ["call_2"]
    assert (await archive.search("plumber visit Friday"))["results"] == []  # the old words are gone
    async with archive.db.transaction() as conn:
        await conn.execute("DELETE FROM transcripts WHERE conversation_id = 'call_2'")
    integrity()
    assert (await archive.search("boiler"))["results"] == []


async def test_transcript_search_is_a_read_only_voice_tool_for_whoever_may_read_the_phone_calls(archive):
    from bot.tools.phone import transcript_tools
    from voice.call.tools import AllowKnownSpeakers, ToolCatalogue

    # the default gate denies every mutating tool; the terminal's one person may read the phone calls
    catalogue = ToolCatalogue(None, transcript_tools(archive, AllowKnownSpeakers()))
    assert catalogue.get("transcript_search").mutating is False
    outcome = await catalogue.run("c1", "transcript_search", json.dumps({"query": "plumber Friday"}))
    found = json.loads(outcome.output)
    assert outcome.ok and found["source_trust"] == "external-untrusted"
    assert [r["conversation_id"] for r in found["results"]] == ["call_2", "call_2"]
    empty = json.loads((await catalogue.run("c2", "transcript_search", json.dumps({"query": "?!"}))).output)
    assert "no words" in empty["error"]


@pytest.mark.parametrize("ref", ["99999999999999999999999", "\u00b2", "#", "", "-1", " 1 x"])
async def test_an_id_that_is_not_one_is_a_clear_miss_not_a_crash(archive, ref):
    with pytest.raises(ArchiveError, match="no archived call"):
        await archive.show(ref)


MATCHING = call("call_m", ("TO", "José called about order 48213 and the e-mail from example.com at 3.5 pm; call 555-1234"),
                ("FROM", "To be or not to be, that is the question. Crème brûlée at the café."),
                ("TO", "Order 482130 please"))


@pytest.mark.parametrize(("query", "turns"), [
    ("Jose", [0]), ("JOSÉ", [0]), ("creme brulee cafe", [1]),  # accents and case are folded
    ("48213", [0]), ("482130", [2]), ("4821", []),  # a number matches whole, never a prefix or a longer one
    ("to be or not to be", [1]), ("that is the", [1]),  # stop-words are words like any other
    ("example", [0]), ("com", [0]), ("3", [0]), ("1234", [0]), ("e-mail", [0]),  # punctuation splits words
    ("question brûlée", [1]), ("order please", [2]), ("José question", [])])  # every word, in one turn
async def test_search_matches_alike_on_both_engines(tmp_path, database_url, query, turns):
    store = await open_store(tmp_path, LISTENER_MIGRATIONS, database_url=database_url)
    try:
        calls = Archive(store)
        await calls.archive(MATCHING, "{}", received_at=1.0, user_label="FROM")
        assert sorted(r["turn_index"] for r in (await calls.search(query))["results"]) == turns
    finally:
        await store.close()


async def test_search_ranks_the_turn_that_says_it_most_first(tmp_path, database_url):
    store = await open_store(tmp_path, LISTENER_MIGRATIONS, database_url=database_url)
    try:
        calls = Archive(store)
        await calls.archive(call("call_r", ("TO", "The plumber came by on a long and tiring afternoon at the office"),
                                 ("FROM", "plumber, plumber, plumber!"), ("TO", "No, the electrician")), "{}",
                            received_at=1.0, user_label="FROM")
        assert [r["turn_index"] for r in (await calls.search("plumber"))["results"]] == [1, 0]
    finally:
        await store.close()
