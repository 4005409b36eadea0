"""`fitted`: the one way a field lists items within Discord's limit (recaps, phone cards); a run's post
and its pages show the agent's words as text."""

from __future__ import annotations

import re
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from bot.discord.embeds import fitted, output_pages, run_embed, runs_list_embed
from runs import RunState, RunTicket


def test_items_that_fit_are_all_shown_and_the_rest_are_counted():
    assert fitted(["a" * 4, "b" * 4], 17) == "aaaa\nbbbb"  # the last item needs no room kept for a count
    assert fitted(["a" * 4, "b" * 4, "c" * 4], 20) == "aaaa\n… and 2 more"  # room kept to say what is left out
    assert fitted(["a" * 30], 20) == "… and 1 more"  # nothing fits: the count alone, no blank first line
    assert fitted(["a", "b"], 100, total=5) == "a\nb\n… and 3 more"  # the caller showed only the first of five


@given(st.lists(st.text(alphabet="ab\u00e9 ", min_size=1, max_size=40), max_size=40), st.integers(20, 400))
def test_the_field_never_outgrows_its_limit_and_counts_every_item(items, limit):
    text = fitted(items, limit)
    assert len(text) <= limit
    lines = text.split("\n") if text else []
    shown = [line for line in lines if not line.startswith("… and ")]
    left = int(lines[-1].split()[2]) if lines and lines[-1].startswith("… and ") else 0
    assert shown == items[:len(shown)] and len(shown) + left == len(items)


# What an agent's output or a task may hold: a masked link, mass mentions, ANSI colours, an OSC 8
# hyperlink, an OSC 52 clipboard write, a bidi override.
HOSTILE = ("[Open the report](https://evil.example/phish) @everyone @here <@&123> <#456>\n"
           "\x1b[31mred\x1b[0m \x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\ "
           "\x1b]52;c;ZWNobyBwd25lZA==\x07 \u202eeno\u202c **bold**")
MENTION = re.compile(r"(?<!\\)@(everyone|here)|<@[!&]?\d+>|<#\d+>")


def hostile_run(**changes) -> RunTicket:
    return RunTicket(**{"id": 5, "lane": "command", "task": f"report {HOSTILE}", "state": RunState.COMPLETED,
                        "created_at": 1.0, "updated_at": 2.0, "finished_at": 2.0, "output": HOSTILE,
                        "error": None, **changes})


def assert_shown_as_text(text: str) -> None:
    assert not MENTION.search(text), text
    assert "[Open the report](" not in text and "\\[Open the report\\](" in text
    assert "**bold**" not in text
    assert not any(unicodedata.category(c) in ("Cc", "Cf") for c in text.replace("\n", "").replace("\u200b", ""))


def test_a_run_post_shows_the_agents_output_and_the_task_as_text():
    embed = run_embed(hostile_run(), 3.0)
    assert_shown_as_text(embed.title)
    assert_shown_as_text(embed.description)
    assert embed.description.count("\n") == 1  # its line break is kept
    failed = run_embed(hostile_run(state=RunState.FAILED, error=HOSTILE), 3.0)
    assert_shown_as_text(next(f.value for f in failed.fields if f.name == "error"))
    assert_shown_as_text(runs_list_embed([hostile_run(), hostile_run(id=6)], 3.0).description)


def test_escaped_output_still_fits_and_says_where_the_rest_is():
    long = hostile_run(output=HOSTILE * 80)  # escaping lengthens it
    embed = run_embed(long, 3.0)
    assert len(embed.description) <= 3500 and embed.description.endswith("`/runs show 5` pages the rest")
    assert_shown_as_text(embed.description.rsplit("\n", 1)[0])
    pages = output_pages(long)
    assert len(pages) > 1 and all(len(page) <= 3900 for page in pages)
    for page in pages:
        assert not MENTION.search(page) and "\x1b" not in page
    assert "".join(pages).count("\\[Open the report\\](") >= 79  # split pages lose at most the link they cut
