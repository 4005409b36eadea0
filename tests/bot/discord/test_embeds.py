"""`fitted`: the one way a field lists items within Discord's limit (recaps, phone cards)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bot.discord.embeds import fitted


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
