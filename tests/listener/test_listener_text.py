"""`quote_untrusted`: the one rendering of a caller's id or text in a listener log line or terminal
line — a single printable, quoted token that reads back as exactly what was sent."""

from __future__ import annotations

import ast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from listener.text import quote_untrusted

HOSTILE = [
    ("newline", "call_1\nstream: connected", '"call_1\\nstream: connected"'),
    ("carriage return", "call_1\r\nFORGED", '"call_1\\r\\nFORGED"'),
    ("escape code", "call_1\x1b[2J\x1b[31mred", '"call_1\\x1b[2J\\x1b[31mred"'),
    ("line separator", "a\u2028b\u2029c\x85d", '"a\\u2028b\\u2029c\\x85d"'),
    ("bidi override", "evt_\u202egnp.exe", '"evt_\\u202egnp.exe"'),
    ("tab and NUL", "a\tb\x00c", '"a\\tb\\x00c"'),
    ("quote and backslash", 'a"b\\c', '"a\\"b\\\\c"'),
    ("lone surrogate", "a\ud800b", '"a\\ud800b"'),
    ("ordinary", "call_42 Ünïcødé ok", '"call_42 Ünïcødé ok"'),
]


@pytest.mark.parametrize(("raw", "shown"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_untrusted_text_is_one_quoted_printable_token(raw, shown):
    assert quote_untrusted(raw) == shown
    assert shown.isprintable() and ast.literal_eval(shown) == raw


def test_long_values_are_cut_inside_the_quotes_and_none_and_numbers_are_shown_plainly():
    assert quote_untrusted("x" * 100, 10) == '"' + "x" * 10 + '…"'
    assert quote_untrusted("\n" * 100, 3) == '"\\n\\n\\n…"'  # the limit counts characters, not escapes
    assert quote_untrusted(None) == "(none)"
    assert quote_untrusted(42) == '"42"'
    with pytest.raises(ValueError):
        quote_untrusted("x", 0)


@given(st.text(max_size=60))
def test_any_text_reads_back_exactly_and_never_spans_lines(text):
    shown = quote_untrusted(text, 60)
    assert shown.isprintable() and shown.startswith('"') and shown.endswith('"')
    assert ast.literal_eval(shown) == text
