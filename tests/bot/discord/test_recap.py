"""The call recap embed: what it shows, how it shows what people said (as text), and that no input can
push it past a Discord limit."""

from __future__ import annotations

import re
import unicodedata

import discord

from bot.discord.recap import CallRecap, SpeakerTime, duration_words, recap_embed, recap_of
from bot.discord.untrusted import escape_caller_text
from runs import RunState, RunTicket
from voice.call.records import CallRecord, CallTurn
from voice.call.summary import CallSummary, parse_summary
from voice.call.usage import CallUsage

ALICE, BOB, MALLORY, GONE = 111111111111111111, 222222222222222222, 333333333333333333, 444444444444444444
HOSTILE = "**@everyone** <@1> [click](x.io)"  # 32 characters, the most Discord allows
START = 1_750_000_000.0
MENTION = re.compile(r"(?<!\\)@(everyone|here)|<@[!&]?\d+>|<#\d+>")  # what Discord would render as a mention

USAGE = CallUsage().add_response({"input_tokens": 1200, "output_tokens": 300,
                                  "input_token_details": {"audio_tokens": 1000, "text_tokens": 200},
                                  "output_token_details": {"audio_tokens": 250, "text_tokens": 50}})


def ticket(run_id: int, state: RunState, task: str) -> RunTicket:
    return RunTicket(id=run_id, lane="command", task=task, state=state, created_at=START, updated_at=START,
                     origin="call-42")


def field(embed: discord.Embed, name: str) -> str:
    values = [f.value for f in embed.fields if f.name == name]
    assert len(values) == 1, [f.name for f in embed.fields]
    return values[0]


def within_discord_limits(embed: discord.Embed) -> None:
    """Discord's embed limits, counted here rather than trusted to `len(embed)`."""
    data = embed.to_dict()
    title, description = data.get("title", ""), data.get("description", "")
    footer = data.get("footer", {}).get("text", "")
    fields = data.get("fields", [])
    assert len(title) <= 256 and len(description) <= 4096 and len(footer) <= 2048
    assert len(fields) <= 25
    for f in fields:
        assert 0 < len(f["name"]) <= 256 and 0 < len(f["value"]) <= 1024, f
    total = len(title) + len(description) + len(footer) + sum(len(f["name"]) + len(f["value"]) for f in fields)
    assert total <= 6000 and total == len(embed)


def recap(**changes) -> CallRecap:
    base = dict(call_id=42, voice_channel_id=9876, started_at=START, ended_at=START + 725, end_reason="the call ended",
                speakers=(SpeakerTime(ALICE, "Alice", 125_000), SpeakerTime(MALLORY, HOSTILE, 600_000),
                          SpeakerTime(BOB, None, 0)),
                runs=(ticket(7, RunState.COMPLETED, "prepare the release notes"),
                      ticket(9, RunState.RUNNING, "check the **build** @everyone")),
                usage=USAGE,
                summary=CallSummary("The release ships on **Friday**.", ("Ship on Friday", "Alice writes the notes")))
    return CallRecap(**{**base, **changes})


def test_durations_read_as_people_say_them():
    assert [duration_words(s) for s in (0.2, 1, 45, 200, 600, 725, 3600, 3900)] == [
        "under 1 s", "1 s", "45 s", "3 min 20 s", "10 min", "12 min", "1 h", "1 h 5 min"]


def test_the_recap_shows_duration_speakers_by_time_runs_cost_summary_and_decisions():
    embed = recap_embed(recap())
    assert embed.title == "Call recap"
    assert embed.description.startswith(f"In <#9876>, <t:{int(START)}:f> to <t:{int(START + 725)}:t> (12 min).")
    assert "The release ships on \\*\\*Friday\\*\\*." in embed.description  # markdown shown as text
    assert field(embed, "duration") == "12 min" and field(embed, "ended") == "the call ended"
    assert field(embed, "who spoke").split("\n") == [
        f"**{escape_caller_text(HOSTILE)}** · 10 min", "**Alice** · 2 min 5 s", f"**user {BOB}**"]
    runs = field(embed, "runs started").split("\n")
    assert runs[0] == "`/runs show 7` · finished · prepare the release notes"
    assert runs[1] == f"`/runs show 9` · running · {escape_caller_text('check the **build** @everyone')}"
    assert field(embed, "decided") == "• Ship on Friday\n• Alice writes the notes"
    assert field(embed, "cost") == USAGE.describe() and "1,200 tokens in" in field(embed, "cost")
    assert embed.footer.text == f"speakers {MALLORY}, {ALICE}, {BOB} · call 42"
    within_discord_limits(embed)


def test_hostile_names_and_tasks_are_shown_as_text_never_as_mentions_or_links():
    embed = recap_embed(recap())
    head, said = embed.description.split("\n\n", 1)  # the head's <#channel> is the bot's own
    everything = "\n".join([said, *(f.value for f in embed.fields), embed.footer.text])
    assert not MENTION.search(everything)
    assert "[click](" not in everything and "\\[click\\]" in everything
    assert HOSTILE not in everything


def test_bidi_overrides_and_escape_sequences_in_names_and_tasks_are_dropped():
    reversed_name = "\u202eeno\u202c"  # shows as "one" backwards-wrapped, reordering what follows
    painted = "\x1b[31mMallory\x1b[0m\u200b\x1b]8;;https://evil.example\x07"
    embed = recap_embed(recap(speakers=(SpeakerTime(ALICE, reversed_name, 9000), SpeakerTime(MALLORY, painted, 8000),
                                        SpeakerTime(BOB, "\u202e\u2066", 7000)),
                              runs=(ticket(3, RunState.COMPLETED, "deploy \x1b]52;c;cHduZWQ=\x07 \u2067now"),)))
    who = field(embed, "who spoke").split("\n")
    assert who == ["**eno** · 9 s", "**\\[31mMallory\\[0m\\]8;;https://evil.example** · 8 s", f"**user {BOB}** · 7 s"]
    assert field(embed, "runs started") == "`/runs show 3` · finished · deploy \\]52;c;cHduZWQ= now"
    everything = "\n".join([embed.description, *(f.value for f in embed.fields)])
    assert not any(unicodedata.category(c) in ("Cc", "Cf") for c in everything.replace("\n", ""))


def test_without_a_summary_the_recap_says_so_and_keeps_everything_else():
    embed = recap_embed(recap(summary=None, summary_note="no text model is configured"))
    assert embed.description.endswith("\n\n*Summary unavailable (no text model is configured).*")
    assert "decided" not in [f.name for f in embed.fields]
    assert {"duration", "who spoke", "runs started", "cost"} <= {f.name for f in embed.fields}
    bare = recap_embed(recap(summary=None, usage=None, runs=(), speakers=(), end_reason=None))
    assert bare.description.endswith("*Summary unavailable.*")
    assert [f.name for f in bare.fields] == ["duration", "who spoke"] and field(bare, "who spoke") == "nobody"
    assert bare.footer.text == "call 42"
    assert field(recap_embed(recap(usage=CallUsage())), "cost") == "none reported"


def test_a_checked_summary_is_escaped_once_for_discord():
    checked = parse_summary({"summary": "Ping @everyone about <@123456789012345678>'s _plan_.",
                             "decisions": ["@here: ship it"]})
    embed = recap_embed(recap(summary=checked))
    assert embed.description.endswith("\n\nPing everyone about someone's \\_plan\\_.")
    assert field(embed, "decided") == "• here: ship it"
    assert "\u200b" not in embed.description  # nothing left for the mention escape: no doubled work


def test_the_recap_stays_within_every_discord_limit_with_huge_inputs():
    speakers = tuple(SpeakerTime(10**17 + n, ("*_`~|<@&1>" * 4)[:32] + str(n), 1000 * n) for n in range(100))
    runs = tuple(ticket(n, RunState.FAILED, "*" * 10_000) for n in range(1, 101))
    summary = CallSummary("[x](y) " * 1500, tuple("_" * 10_000 for _ in range(5)))
    embed = recap_embed(recap(speakers=speakers, runs=runs, summary=summary, end_reason="<@1> " * 1000))
    within_discord_limits(embed)
    who = field(embed, "who spoke").split("\n")
    assert who[0].endswith("· 1 min 39 s") and who[-1] == "… and 90 more"  # most talkative first, capped
    assert field(embed, "runs started").split("\n")[-1] == "… and 90 more"
    assert field(embed, "runs started").startswith("`/runs show 1` · failed · ")
    assert embed.footer.text.endswith(" more · call 42") and str(10**17 + 99) in embed.footer.text
    decided = field(embed, "decided").split("\n")  # escaping doubles "_": each is cut to fit, not dropped
    assert len(decided) == 5 and all(150 < len(line) <= 198 and line.endswith(" …") for line in decided)
    assert len(embed.description) > 1000
    # a summary checked by parse_summary, from a 10 kB answer, fits as well
    checked = parse_summary({"summary": "*" * 10_000, "decisions": ["<@1>" * 3000] * 9})
    within_discord_limits(recap_embed(recap(speakers=speakers, runs=runs, summary=checked)))


def test_a_record_becomes_a_recap_with_names_from_members_else_from_its_turns():
    turns = (CallTurn(1, START + 5, "user", GONE, "Gone Member", "bye all"),
             CallTurn(2, START + 6, "assistant", None, "assistant", "Bye!"),
             CallTurn(3, START + 7, "user", ALICE, "Alice (old nick)", "see you"),
             CallTurn(4, START + 30, "user", GONE, "Gone Member Renamed", "really bye"))
    record = CallRecord(id=42, guild_id=1, voice_channel_id=9876, text_channel_id=5, started_by=ALICE, mode="room",
                        captions=False, started_at=START, ended_at=None, end_reason="idle", state="live", turns=turns)
    runs = [ticket(7, RunState.COMPLETED, "notes")]
    made = recap_of(record, spoken_ms={ALICE: 4200.7, BOB: 900}, names={ALICE: "Alice", BOB: "Bob"}, runs=runs,
                    usage=USAGE, summary_note="the text model did not answer")
    assert made.call_id == 42 and made.voice_channel_id == 9876 and made.end_reason == "idle"
    assert made.started_at == START and made.ended_at == START + 30  # no end recorded: the last turn
    assert sorted(made.speakers) == sorted([SpeakerTime(ALICE, "Alice", 4200), SpeakerTime(BOB, "Bob", 900),
                                            SpeakerTime(GONE, "Gone Member Renamed", 0)])
    assert made.runs == tuple(runs) and made.usage is USAGE and made.summary is None
    assert recap_of(record, spoken_ms={}, ended_at=START + 60).duration_s == 60
    odd = recap_of(record, spoken_ms={ALICE: float("inf"), BOB: float("nan"), MALLORY: -5}, names={})
    assert {s.user_id: s.spoken_ms for s in odd.speakers} == {ALICE: 0, BOB: 0, MALLORY: 0, GONE: 0}
    assert {s.user_id: s.name for s in odd.speakers}[ALICE] == "Alice (old nick)"
    ended = recap_of(CallRecord(**{**record.__dict__, "ended_at": START + 90, "turns": ()}), spoken_ms={})
    assert ended.ended_at == START + 90 and ended.speakers == ()
    within_discord_limits(recap_embed(made))
