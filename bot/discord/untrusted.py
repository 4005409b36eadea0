"""Caller-controlled text (display names, transcriptions, what a phone caller said) shown in Discord as
text, never as markup: one escaping rule for every post, embed and caption.

`escape_caller_text` neutralises markdown, mentions (`@everyone`, `<@id>`), masked links `[x](url)`
and every `<…>` token (`<#…>`, `<t:…>`, `</…>`); `untrusted` also folds it to one line and cuts it;
`shown` drops control and format characters too (ESC sequences, bidi overrides, zero-width ones:
`common.visible`) and keeps the escaped result within a length — agent output, run tasks and display
names in run posts and the recap go through it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import discord

from common.visible import plain_line, printable
from runs.wording import bounded

# After escape_markdown: a bracket or markdown character not already escaped (preceded by an even run of
# backslashes), outside a link. escape_markdown escapes only the first bracket of a span shaped like a
# masked link `[…](…)` and nothing inside it, so `**bold**` there would still take effect.
_BARE_MARKDOWN = re.compile(r"(?P<url>(?:https?|steam)://[^\s<\[\]]+)|(?<!\\)((?:\\\\)*)([\[\]*_~|`])")


def escape_caller_text(text: str) -> str:
    """`text` shown as text: markdown, mentions, masked links and `<…>` tokens neutralised."""
    text = discord.utils.escape_markdown(text)
    text = discord.utils.escape_mentions(text)
    text = _BARE_MARKDOWN.sub(lambda m: m["url"] or f"{m[2]}\\{m[3]}", text)
    return text.replace("<", "<\u200b")


def untrusted(text: str | None, limit: int | None = None) -> str:
    """Caller text for an embed: one line, cut to `limit` first, then escaped (`escape_caller_text`)."""
    line = bounded(text, limit) if limit is not None else " ".join((text or "").split())
    return escape_caller_text(line)


def shown(text: str | None, limit: int, *, lines: bool = False) -> str:
    """Untrusted `text` escaped (`escape_caller_text`) in at most `limit` characters, with no control or
    format character: one line (`common.visible.plain_line`), or with its lines kept (`lines=True`,
    `common.visible.printable`). Cut before escaping, so no escape is ever cut in half; cut shorter
    when escaping made it longer; a cut ends with " …"."""
    clean = printable(text or "").strip() if lines else plain_line(text)

    def cut(room: int) -> str:
        if lines:
            return clean if len(clean) <= room else clean[:max(0, room - 2)].rstrip() + " …"
        return bounded(clean, max(0, room - 2))

    line, room = escaped_within(cut, limit)
    return line if len(line) <= limit else "…"


def escaped_within(piece: Callable[[int], str], limit: int) -> tuple[str, int]:
    """`escape_caller_text(piece(room))` for the largest `room` (from `limit` down) whose escaped text fits
    in `limit` characters, and that room; the last try (room 2) when none fits."""
    room = limit
    while True:
        line = escape_caller_text(piece(room))
        if len(line) <= limit or room <= 2:
            return line, room
        room = min(room - 1, room * limit // len(line))  # escaping grew it by about that ratio
