"""Live captions: the line format (adversarial), the batching core in virtual time, and the thread
shell through the real discord.py against the loopback fake Discord (sharing the virtual clock)."""

from __future__ import annotations

import asyncio
import logging
import random
import re
import unicodedata

import discord
import pytest

from bot.discord.caption_log import (
    CaptionLog,
    EditMessage,
    InvalidState,
    PostMessage,
    caption_line,
    cut_line,
    discord_length,
)
from bot.discord.captions import CaptionThread
from tests.support.clock import VirtualClock
from tests.support.fake_discord import FakeDiscord
from tests.support.fake_discord.checks import pinged
from tests.support.fake_discord.pointing import gateway_client

AGENT = "Switchboard"
WAIT_S = 15.0
CREATE_PUBLIC_THREADS, SEND_MESSAGES_IN_THREADS = 1 << 35, 1 << 38


def assert_inert(line: str) -> None:
    """Nothing in `line` is live Discord syntax beyond the bold name: no ping (checked by the fake's
    own mention parser, with every mention allowed), no `<…>` token, no masked link, one line."""
    assert pinged(line, None) == {"everyone": False, "users": [], "roles": []}, line
    assert not re.search(r"<(?!\u200b)", line), line
    assert not re.search(r"(?<!\\)((?:\\\\)*)[\[\]]", line), line  # every bracket escaped
    assert "\n" not in line and "\r" not in line
    assert not any(unicodedata.category(c) in ("Cc", "Cf") for c in line.replace("\u200b", "")), line
    body = re.sub(r"https?://\S+", "", line.split("**: ", 1)[1])  # Discord formats nothing inside a link
    assert not re.search(r"(?<!\\)((?:\\\\)*)[*_~|`]", body), line  # no markdown left in what was said


# -- one line --------------------------------------------------------------------------------------


def test_a_person_and_the_assistant_each_get_a_bold_name_and_their_words():
    assert caption_line("user", "Alice", "Hello there", agent_name=AGENT) == "**Alice**: Hello there"
    assert caption_line("assistant", None, "Hi Alice", agent_name=AGENT) == "**Switchboard (assistant)**: Hi Alice"
    assert caption_line("user", None, "who am I", agent_name=AGENT) == "**Someone**: who am I"
    assert caption_line("user", "Alice", " \n\t\u200b ", agent_name=AGENT) is None  # nothing to show


@pytest.mark.parametrize("name, text", [
    ("**@everyone** [click](https://evil)", "hi"),
    ("<@123>", "<@123> <@!123> <@&456> <#789> </talk join:1> <t:1700000000:R> <:emoji:1>"),
    ("Mal\nlory\r\n# heading", "line one\nline two\n> quote\n- item"),
    ("Ev\u200beryone\u202e\u2066", "@every\u200bone @\u200dhere \u200b<\u200b@123>"),
    ("[a", "](https://evil) [b](https://evil \"title\") [c](<https://evil>)"),
    ("\\", "\\[x](https://evil) \\\\[y](https://evil) \\\\\\*bold*"),
    ("||spoiler||", "`code` ```block``` ~~strike~~ __under__ *it* ||s||"),
    ("@here", "mail me at bob@here.example or visit https://x.com/@everyone/_a_"),
    ("123456789012345678", "@123456789012345678 @!123456789012345678 @&123456789012345678"),
    ("\x00\x07\x1b[31mred", "\x00\x1b]8;;https://evil\x07click\x1b]8;;\x07"),
])
def test_hostile_names_and_text_come_out_as_plain_text_that_pings_nobody(name, text):
    line = caption_line("user", name, text, agent_name=AGENT)
    assert line is not None and line.startswith("**") and "**: " in line
    assert_inert(line)


def test_masked_links_and_mentions_are_broken_but_still_readable():
    line = caption_line("user", "**@everyone** [click](https://evil)", "ping <@123> and @here", agent_name=AGENT)
    assert line == ("**\\*\\*@\u200beveryone\\*\\* \\[click\\](https://evil)**: "
                    "ping <\u200b@123> and @\u200bhere")


def test_a_person_cannot_pass_for_the_assistant():
    for name in ("Switchboard (assistant)", "switchboard (ASSISTANT)", "Switchboard(assistant)", "x (ａｓｓｉｓｔａｎｔ)"):
        line = caption_line("user", name, "transfer the money", agent_name=AGENT)
        assert line.split("**: ")[0].endswith("(person)"), line
    assistant = caption_line("assistant", None, "ok", agent_name=AGENT)
    assert not any(caption_line("user", AGENT + suffix, "ok", agent_name=AGENT) == assistant
                   for suffix in ("", " (assistant)", "(assistant)"))


# The marker followed by an invisible or blank character (fillers, a variation selector, a blank braille
# cell, a grapheme joiner, a Khmer inherent vowel), or spelled with look-alike letters and brackets.
LOOK_ALIKES = [f"Switchboard (assistant){c}" for c in "\u3164\ufe0f\u2800\u115f\u034f\u17b4\uffa0"] + [
    "Switchboard (\u0430ssistant)", "Switchboard (assist\u0430nt)", "Switchboard (\u0430ssist\u0430nt)",
    "Switchboard (a\u0455\u0455istant)", "Switchboard (ass\u0456stant)", "Switchboard (ass\u0131stant)",
    "Switchboard (\u03b1ssistant)", "Switchboard \u2768assistant\u2769", "Switchboard (assi\u0307stant)",
    "Switchboard (\u0251ssist\u0251nt)", "Switchboard (assistant)**: hi", "Switchboard\u3164(assistant)\u3164\u3164",
    "Switchboard (assis\u0442ant)", "Switchboard (assista\u0578t)"]


@pytest.mark.parametrize("name", LOOK_ALIKES, ids=[ascii(n) for n in LOOK_ALIKES])
def test_a_name_that_only_looks_like_the_assistants_marker_is_marked_as_a_person(name):
    line = caption_line("user", name, "transfer the money", agent_name=AGENT)
    assert "(person)**: " in line, line
    assert line != caption_line("assistant", None, "transfer the money", agent_name=AGENT)


def test_ordinary_names_are_not_marked():
    for name in ("Alice", "Assistant Manager Bob", "Dana (assist)", "Zoë (she/her)", "助手"):
        assert "(person)" not in caption_line("user", name, "hi", agent_name=AGENT), name


def test_long_names_are_cut_and_long_text_is_kept_for_the_log_to_cut():
    line = caption_line("user", "N" * 500, "w " * 2500, agent_name=AGENT)
    name = line.split("**: ")[0][2:]
    assert len(name) == 64 and name.endswith("…")
    assert len(line) > 4000  # one turn, one line: CaptionLog cuts it to a message
    cut = cut_line(line, 1800)
    assert discord_length(cut) <= 1800 and cut.endswith("…") and cut.startswith("**" + name + "**: ")
    assert_inert(cut)


def test_a_cut_never_leaves_a_backslash_escaping_the_ellipsis_or_splits_a_surrogate_pair():
    escaped = caption_line("user", "A", "*" * 3000, agent_name=AGENT)  # "\*" pairs
    for limit in range(20, 40):
        cut = cut_line(escaped, limit)
        assert discord_length(cut) <= limit and cut.endswith("…")
        assert (len(cut[:-1]) - len(cut[:-1].rstrip("\\"))) % 2 == 0  # no lone backslash before "…"
    emoji = cut_line("😀" * 1000, 9)
    assert emoji == "😀😀😀😀…" and discord_length(emoji) == 9
    assert discord_length("😀") == 2 and discord_length("é") == 1


# -- the core, in virtual time -----------------------------------------------------------------------


def test_the_first_line_is_posted_at_once_and_the_next_waits_for_the_edit_interval():
    log = CaptionLog()
    log.add(0.0, "one")
    assert log.due(0.0) == PostMessage(0, "one")
    assert log.due(0.0) is None and log.wake_at() is None  # one request in flight
    log.sent(0.2)
    log.add(0.3, "two")
    log.add(0.5, "three")
    assert log.due(1.6) is None and log.wake_at() == pytest.approx(1.7)  # 1.5 s after the post completed
    assert log.due(1.7) == EditMessage(0, "one\ntwo\nthree")  # coalesced into one edit
    log.sent(1.8)
    assert not log.pending and log.wake_at() is None
    assert (log.lines, log.shown, log.messages) == (3, 3, 1)


def test_lines_added_while_a_request_is_in_flight_go_in_the_next_edit():
    log = CaptionLog()
    log.add(0.0, "one")
    assert log.due(0.0) == PostMessage(0, "one")
    log.add(0.1, "two")
    log.sent(0.4)
    assert log.pending and log.shown == 1
    assert log.due(1.9) == EditMessage(0, "one\ntwo")


def test_a_message_full_or_ten_seconds_old_takes_no_more_lines():
    log = CaptionLog(max_chars=20)
    log.add(0.0, "a" * 10)
    log.add(0.0, "b" * 9)  # 10 + 1 + 9 = 20: fits exactly
    log.add(0.0, "c")  # 21 would not
    assert log.due(0.0) == PostMessage(0, "a" * 10 + "\n" + "b" * 9)
    log.sent(0.0)
    assert log.due(0.0) == PostMessage(1, "c")  # a new message need not wait for the edit interval
    log.sent(0.1)
    log.add(9.9, "d")
    log.add(10.1, "e")  # message 1 opened at 0.0: too old now
    assert log.due(10.1) == EditMessage(1, "c\nd")
    log.sent(10.2)
    assert log.due(10.2) == PostMessage(2, "e")


def test_a_line_longer_than_a_message_is_cut_with_an_ellipsis():
    log = CaptionLog()
    log.add(0.0, "x" * 5000)
    action = log.due(0.0)
    assert action == PostMessage(0, "x" * 1799 + "…") and discord_length(action.text) == 1800


def test_never_more_than_five_requests_in_five_seconds_in_the_thread():
    log = CaptionLog()
    for i in range(7):
        log.add(0.0, str(i) * 1000)  # each fills a message of its own
    done = []
    for _ in range(5):
        action = log.due(0.0)
        done.append(action.slot)
        log.sent(0.25)
    assert done == [0, 1, 2, 3, 4]
    assert log.due(5.0) is None and log.wake_at() == pytest.approx(5.25)  # 5 s after the first completed
    assert log.due(5.25) == PostMessage(5, "5" * 1000)


def test_messages_are_posted_in_order_while_earlier_ones_are_still_edited():
    log = CaptionLog(max_chars=10)
    log.add(0.0, "a")
    log.due(0.0)
    log.sent(0.0)
    log.add(0.5, "b")  # message 0 must wait until 1.5 for its edit
    log.add(0.6, "c" * 10)  # does not fit: message 1
    assert log.due(0.6) == PostMessage(1, "c" * 10)
    log.sent(0.7)
    assert log.due(1.5) == EditMessage(0, "a\nb")


def test_after_a_failure_nothing_is_requested_and_every_lost_line_is_counted():
    log = CaptionLog()
    log.add(0.0, "one")
    log.add(0.0, "two")
    log.due(0.0)
    assert log.fail() == 2  # the post failed: neither line is shown
    log.add(1.0, "three")
    assert log.due(100.0) is None and log.wake_at() is None and not log.pending
    assert (log.dropped, log.lines, log.shown) == (3, 0, 0)


def test_reporting_a_request_that_was_never_made_is_a_misuse():
    log = CaptionLog()
    with pytest.raises(InvalidState):
        log.sent(0.0)
    log.add(0.0, "x")
    log.due(0.0)
    log.sent(0.0)
    with pytest.raises(InvalidState):
        log.sent(0.0)


def simulate(seed: int) -> None:
    """Random bursts and trickles of lines of random sizes, requests with random latency; the rules hold
    at every step and every line ends up shown once, in order."""
    rng = random.Random(seed)
    log = CaptionLog()
    arrivals: list[float] = []
    t = 0.0
    while len(arrivals) < rng.randint(1, 150):
        t += rng.choice([0.0, 0.0, 0.05, 0.3, 1.0, 4.0, 12.0])
        arrivals.append(t)
    lines = [f"{i}:" + "x" * rng.choice([1, 30, 200, 900, 1790, 3000]) + "😀" * rng.choice([0, 0, 5, 900])
             for i in range(len(arrivals))]
    shown: dict[int, str] = {}
    first_line_at: dict[int, float] = {}
    requests: list[tuple[float, float, int]] = []  # (issued, completed, slot)
    in_flight: tuple[PostMessage | EditMessage, float, float] | None = None
    now, i = 0.0, 0
    for _ in range(100_000):
        if i == len(arrivals) and not log.pending and in_flight is None:
            break
        times = [arrivals[i]] if i < len(arrivals) else []
        if in_flight is not None:
            times.append(in_flight[2])
        wake = log.wake_at()
        if wake is not None:
            times.append(max(wake, now))
        now = max(now, min(times))
        if in_flight is not None and in_flight[2] <= now:
            action, issued, _ = in_flight
            assert isinstance(action, PostMessage) == (action.slot not in shown)
            assert isinstance(action, EditMessage) or action.slot == len(shown)  # posted in order
            shown[action.slot] = action.text
            log.sent(now)
            requests.append((issued, now, action.slot))
            in_flight = None
        while i < len(arrivals) and arrivals[i] <= now:
            log.add(now, lines[i])
            i += 1
        if in_flight is None:
            action = log.due(now)
            if action is not None:
                assert discord_length(action.text) <= 1800
                first_line_at.setdefault(action.slot, now)
                in_flight = (action, now, now + rng.uniform(0.0, 0.8))
    else:
        raise AssertionError("the simulation did not settle")

    everything = "\n".join(shown[slot] for slot in sorted(shown)).split("\n")
    assert everything == [cut_line(line, 1800) for line in lines]
    for slot in {s for _, _, s in requests}:
        mine = [(issued, done) for issued, done, s in requests if s == slot]
        assert all(b[0] >= a[1] + 1.5 for a, b in zip(mine, mine[1:], strict=False)), (seed, slot)
    assert all(requests[j + 5][0] >= requests[j][1] + 5.0 for j in range(len(requests) - 5)), seed


@pytest.mark.parametrize("seed", range(60))
def test_random_traffic_shows_every_line_once_in_order_within_the_rate_limits(seed):
    simulate(seed)


# -- the thread on (fake) Discord ------------------------------------------------------------------


def bot_in(fake: FakeDiscord):
    """A discord.py client on the fake (REST and gateway), once it has cached the guild."""
    return gateway_client(fake, timeout=WAIT_S)


def captions_for(guild: discord.Guild, fake: FakeDiscord, clock: VirtualClock) -> CaptionThread:
    return CaptionThread(guild.get_channel(fake.text_channel.id), agent_name=AGENT, voice_channel_name="Lounge",
                         call_id="g1-test", clock=clock, sleep=clock.sleep)


def visible_lines(fake: FakeDiscord) -> list[str]:
    (thread,) = fake.threads
    return "\n".join(m["content"] for m in fake.thread_messages(thread)).split("\n")


def writes(fake: FakeDiscord) -> list:
    thread = fake.threads[0].id
    return [c for c in fake.journal.rest if f"/channels/{thread}/messages" in c.path]


def assert_paced(fake: FakeDiscord) -> None:
    """On the fake's clock: ≤ 5 writes in any 5 s, ≥ 1.5 s between two writes of one message, no 429."""
    calls = writes(fake)
    assert fake.state.rate_limited == [] and all(c.status == 200 for c in calls)
    assert all(calls[j + 5].at >= calls[j].at + 5.0 for j in range(len(calls) - 5))
    by_message: dict[str, list[float]] = {}
    for call in calls:
        by_message.setdefault(call.response["id"], []).append(call.at)
    for times in by_message.values():
        assert all(b >= a + 1.5 for a, b in zip(times, times[1:], strict=False)), times


async def test_captions_start_a_public_thread_under_the_channel_named_after_the_call():
    clock = VirtualClock(1_000.0, auto=True)
    async with FakeDiscord(clock=clock) as fake, bot_in(fake) as guild:
        captions = captions_for(guild, fake, clock)
        before = captions.status()
        thread = await captions.start()
        on = captions.status()
        await captions.close()
    fake.assert_clean()
    (made,) = fake.threads
    assert thread.id == made.id and thread.parent_id == fake.text_channel.id
    assert (made.type, made.auto_archive_duration, made.owner_id) == (11, 60, fake.bot.id)
    assert re.fullmatch(r"Call captions — Lounge — \d{4}-\d\d-\d\d \d\d:\d\d UTC", made.name), made.name
    assert (before, on) == ("off", f"on: 0 lines in 0 messages in <#{made.id}>")
    assert captions.status() == "off" and fake.thread_messages(made) == []


async def test_a_burst_of_30_lines_is_all_visible_in_two_messages_without_a_429():
    clock = VirtualClock(1_000.0, auto=True)
    said = [(("user", "Alice"), ("user", "Bob"), ("assistant", None))[i % 3] + (f"turn {i}: " + "words " * 15,)
            for i in range(30)]
    async with FakeDiscord(clock=clock) as fake, bot_in(fake) as guild:
        captions = captions_for(guild, fake, clock)
        await captions.start()
        for role, name, text in said:  # all at once, as fast as the engine can call
            captions.add(role, name, text)
        await captions.close()
        status = captions.status()
    fake.assert_clean()
    expected = [caption_line(role, name, text, agent_name=AGENT) for role, name, text in said]
    assert visible_lines(fake) == expected
    messages = fake.thread_messages(fake.threads[0])
    assert len(messages) == 2 and all(len(m["content"]) <= 1800 for m in messages)
    assert [c.method for c in writes(fake)] == ["POST", "POST"]  # nothing left to edit
    assert_paced(fake)
    assert status == "off"
    assert expected[2].startswith("**Switchboard (assistant)**: turn 2")


async def test_lines_trickling_in_are_each_shown_by_paced_edits_and_new_messages():
    """Each line waits until it is visible before the next is spoken: ~30 requests, paced by the core on
    the clock the fake's write limit reads, across several messages as each turns 10 s old."""
    clock = VirtualClock(1_000.0, auto=True)
    async with FakeDiscord(clock=clock) as fake, bot_in(fake) as guild:
        captions = captions_for(guild, fake, clock)
        await captions.start()
        for i in range(30):
            captions.add("user", "Alice", f"line {i}")
            await fake.journal.wait_for(lambda i=i: fake.threads and visible_lines(fake)[-1].endswith(f"line {i}"),
                                        WAIT_S)
            clock.now += 0.2
        status = captions.status()
        await captions.close()
    fake.assert_clean()
    assert visible_lines(fake) == [f"**Alice**: line {i}" for i in range(30)]
    messages = fake.thread_messages(fake.threads[0])
    assert 3 <= len(messages) <= 6 and sum(fake.edits_of(m) for m in messages) == 30 - len(messages)
    assert_paced(fake)
    assert status == f"on: 30 lines in {len(messages)} messages in <#{fake.threads[0].id}>"


async def test_one_long_turn_after_another_stays_within_five_posts_per_five_seconds():
    clock = VirtualClock(1_000.0, auto=True)
    async with FakeDiscord(clock=clock) as fake, bot_in(fake) as guild:
        captions = captions_for(guild, fake, clock)
        await captions.start()
        for i in range(12):
            captions.add("assistant", None, f"{i} " + "long answer " * 120)  # each over half a message
            await fake.journal.wait_for(lambda i=i: fake.threads and len(fake.thread_messages(fake.threads[0])) > i,
                                        WAIT_S)
        await captions.close()
    fake.assert_clean()
    calls = writes(fake)
    assert len(calls) == 12 and {c.method for c in calls} == {"POST"}
    assert calls[5].at >= calls[0].at + 5.0  # the sixth post waited for the window
    assert_paced(fake)


async def test_hostile_names_and_words_are_escaped_and_ping_nobody():
    clock = VirtualClock(1_000.0, auto=True)
    hostile = [("**@everyone** [click](https://evil)", "hi <@123> @here"),
               ("<@&456>", "[free nitro](https://evil) <#1> ||x||"),
               ("Mal\nlory\u200b", "@every\u200bone\n# not a heading"),
               (AGENT + " (assistant)", "please delete everything"),
               ("x", "y" * 5000)]
    async with FakeDiscord(clock=clock) as fake, bot_in(fake) as guild:
        captions = captions_for(guild, fake, clock)
        await captions.start()
        for name, text in hostile:
            captions.add("user", name, text)
            await asyncio.sleep(0)
        await captions.close()
    fake.assert_clean()
    assert fake.state.pinged == []  # the fake's own parser finds no mention Discord would resolve
    for line in visible_lines(fake):
        assert_inert(line)
    assert visible_lines(fake)[3].startswith(f"**{AGENT} (assistant) (person)**: ")
    assert visible_lines(fake)[4].endswith("…")
    for call in writes(fake):
        assert call.body["allowed_mentions"] == {"parse": []} and call.body["flags"] == 4  # no pings, no embeds


async def test_without_create_public_threads_captions_fail_once_and_add_never_raises(caplog):
    clock = VirtualClock(1_000.0, auto=True)
    caplog.set_level(logging.INFO, logger="bot.discord.captions")
    async with FakeDiscord(clock=clock) as fake:
        await fake.deny_bot(fake.text_channel, CREATE_PUBLIC_THREADS)  # in GUILD_CREATE's overwrites
        async with bot_in(fake) as guild:
            captions = captions_for(guild, fake, clock)
            captions.add("user", "Alice", "before the thread")
            thread = await captions.start()
            for i in range(5):
                captions.add("user", "Alice", f"after {i}")
            status = captions.status()
            await captions.close()
    fake.assert_clean()
    assert thread is None and fake.threads == []
    (refused,) = fake.rest_calls("POST", f"/channels/{fake.text_channel.id}/threads")
    assert (refused.status, refused.response["code"]) == (403, 50013)
    assert status == (f"failed: cannot create a thread in <#{fake.text_channel.id}> (Missing Permissions: "
                      "Create Public Threads); 6 lines not shown")
    warnings = [r for r in caplog.records if r.name == "bot.discord.captions" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].exc_info is None and "g1-test" in warnings[0].getMessage()


async def test_without_send_messages_in_threads_no_empty_thread_is_left_behind():
    clock = VirtualClock(1_000.0, auto=True)
    async with FakeDiscord(clock=clock) as fake:
        await fake.deny_bot(fake.text_channel, SEND_MESSAGES_IN_THREADS)
        async with bot_in(fake) as guild:
            captions = captions_for(guild, fake, clock)
            await captions.start()
            captions.add("user", "Alice", "hello")
            status = captions.status()
            await captions.close()
    fake.assert_clean()
    assert fake.rest_calls("POST", f"/channels/{fake.text_channel.id}/threads") == []
    assert status == (f"failed: cannot post in threads in <#{fake.text_channel.id}> (missing Send Messages in "
                      "Threads); 1 line not shown")


@pytest.mark.parametrize("failure, reason", [("forbidden", "Missing Permissions"), ("unknown", "Unknown Channel")])
async def test_a_thread_that_stops_taking_posts_ends_the_captions_not_the_call(failure, reason, caplog):
    clock = VirtualClock(1_000.0, auto=True)
    async with FakeDiscord(clock=clock) as fake, bot_in(fake) as guild:
        captions = captions_for(guild, fake, clock)
        thread = await captions.start()
        captions.add("user", "Alice", "shown")
        await fake.journal.wait_for(lambda: fake.thread_messages(thread.id), WAIT_S)
        fake.fail_channel(thread.id, failure)  # e.g. a moderator deleted or locked the thread
        captions.add("user", "Alice", "lost")
        await fake.journal.wait_for(lambda: any(c.status >= 400 for c in writes(fake)), WAIT_S)
        for _ in range(3):
            captions.add("assistant", None, "also lost")  # never raises, whether or not the failure is known
        await captions.close()  # the worker stops at the failure; nothing to flush
        status = captions.status()
    fake.assert_clean()
    assert [m["content"] for m in fake.thread_messages(thread.id)] == ["**Alice**: shown"]
    assert status == f"failed: cannot post in <#{thread.id}> ({reason}); 4 lines not shown"
    warnings = [r for r in caplog.records if r.name == "bot.discord.captions" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].exc_info is None
