"""Untrusted text made visible, for a terminal or a Discord post: no control or format characters.

Agent output, run tasks, display names and transcripts may carry ESC sequences (colours, OSC 8
hyperlinks, OSC 52 clipboard writes), bidi overrides and zero-width characters. `printable` keeps
text's lines (for `switchboard runs show`, the terminal poster, a run's post); `plain_line` folds it
to one line (captions, display names in the recap). Neither escapes markdown or mentions: Discord
text also goes through `bot.discord.untrusted.escape_caller_text`.
"""

from __future__ import annotations

import re
import unicodedata

ELLIPSIS = "…"
_SPACE = re.compile(r"\s+")


def printable(text: str) -> str:
    """Text for a terminal: every control or format character (ESC, bidi overrides, zero-width ones)
    shown as U+FFFD, so none acts; newlines and tabs kept."""
    return "".join(c if c.isprintable() or c in "\n\t" else "\ufffd" for c in text)


def plain_line(value: object, limit: int | None = None) -> str:
    """One line of visible text: control/format characters dropped, whitespace collapsed, cut to `limit`."""
    kept = []
    for ch in str(value or ""):
        kind = unicodedata.category(ch)
        if ch.isspace() or kind in ("Zl", "Zp"):
            kept.append(" ")
        elif kind not in ("Cc", "Cf", "Cs", "Co"):
            kept.append(ch)
    plain = _SPACE.sub(" ", "".join(kept)).strip()
    if limit is not None and len(plain) > limit:
        plain = plain[:limit - 1].rstrip() + ELLIPSIS
    return plain
