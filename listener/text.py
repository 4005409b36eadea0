"""Untrusted text in the listener's own log lines and terminal output.

Ids (`conversation_id`, `event_id`), labels and snippets come from the Smartnumbers payload. Put
raw into a log line, a newline writes a second, forged line and an escape sequence repaints the
operator's terminal. `quote_untrusted` is the one rendering every listener log line and terminal
line uses for such a value: pure, no I/O.
"""

from __future__ import annotations

__all__ = ["quote_untrusted"]

DEFAULT_LIMIT = 80


def quote_untrusted(value: object, limit: int = DEFAULT_LIMIT) -> str:
    """`value` as one printable, double-quoted token: at most `limit` of its characters (then `…`
    inside the quotes), every character that is not printable — control characters, escape codes,
    line and paragraph separators, every space but U+0020, bidi and other format characters — as a
    Python-style escape (`\\n`, `\\x1b`, `\\u2028`), and `"` and `\\` escaped, so the result never
    spans lines, never ends the quote early and reads back unambiguously. None is `(none)`."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    if value is None:
        return "(none)"
    text = value if isinstance(value, str) else str(value)
    cut = len(text) > limit
    out = []
    for ch in text[:limit] if cut else text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(_escape(ch))
    return '"' + "".join(out) + ("…" if cut else "") + '"'


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
