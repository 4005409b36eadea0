"""Caller-controlled text (display names, transcriptions, what a phone caller said) shown in Discord as
text, never as markup: one escaping rule for every post, embed and caption.

`escape_caller_text` neutralises markdown, mentions (`@everyone`, `<@id>`), masked links `[x](url)`
and every `<…>` token (`<#…>`, `<t:…>`, `</…>`); `untrusted` also folds it to one line and cuts it.
"""

from __future__ import annotations

import re

import discord

from runs.wording import bounded

# After escape_markdown: a bracket not already escaped (preceded by an even run of backslashes).
_BARE_BRACKET = re.compile(r"(?<!\\)((?:\\\\)*)([\[\]])")


def escape_caller_text(text: str) -> str:
    """`text` shown as text: markdown, mentions, masked links and `<…>` tokens neutralised."""
    text = discord.utils.escape_markdown(text)
    text = discord.utils.escape_mentions(text)
    text = _BARE_BRACKET.sub(r"\1\\\2", text)
    return text.replace("<", "<\u200b")


def untrusted(text: str | None, limit: int | None = None) -> str:
    """Caller text for an embed: one line, cut to `limit` first, then escaped (`escape_caller_text`)."""
    line = bounded(text, limit) if limit is not None else " ".join((text or "").split())
    return escape_caller_text(line)
