"""Embeds for runs and calls, kept inside Discord's limits (4096 description, 6000 per message).

A run's task, output, error and progress are the agent's or a caller's words: shown as text
(`bot.discord.untrusted.shown`), never as markdown, masked links, mentions or control sequences."""

from __future__ import annotations

from collections.abc import Sequence

import discord

from bot.discord.untrusted import escape_caller_text, escaped_within, shown
from common.visible import printable
from runs import RunState, RunTicket
from runs.wording import STATE_WORDS, bounded, elapsed_words

DESCRIPTION_LIMIT = 4096
MESSAGE_LIMIT = 6000
TITLE_LIMIT = 256
FIELD_LIMIT = 1024

COLOURS = {
    RunState.STARTING: 0x5865F2, RunState.RUNNING: 0x5865F2, RunState.WAITING_FOR_APPROVAL: 0xFEE75C,
    RunState.COMPLETED: 0x57F287, RunState.FAILED: 0xED4245, RunState.CANCELLED: 0x95A5A6,
    RunState.LOST: 0xE67E22,
}
OK, WARN = 0x57F287, 0xFEE75C


def fitted(items: Sequence[str], limit: int, *, total: int | None = None) -> str:
    """One item per line, as many as fit in `limit` characters with room left to say how many of `total`
    (default: all the items) are left out."""
    total = len(items) if total is None else total
    text = ""
    for n, item in enumerate(items):
        candidate = text + ("\n" if text else "") + item
        left = total - n - 1
        if len(candidate) + (len(f"\n… and {left} more") if left else 0) > limit:
            rest = f"… and {total - n} more"
            return f"{text}\n{rest}" if text else rest
        text = candidate
    return text + (f"\n… and {total - len(items)} more" if total > len(items) else "")


def run_embed(ticket: RunTicket, now: float, *, description_limit: int = 3500) -> discord.Embed:
    """One run: state colour, requester, lane, duration, output (cut, with where to read the rest)."""
    took = elapsed_words(ticket.elapsed(ticket.finished_at or now))
    embed = discord.Embed(title=shown(f"Run {ticket.id}: {ticket.task}", TITLE_LIMIT - 2),
                          colour=COLOURS[ticket.state])
    body = ticket.output or ticket.error or ticket.progress or ""
    text = escape_caller_text(printable(body).strip())
    if len(text) > description_limit:
        text = shown(body, description_limit - 80, lines=True) + f"\n… cut here; `/runs show {ticket.id}` pages the rest"
    embed.description = text or None
    embed.add_field(name="state", value=STATE_WORDS[ticket.state], inline=True)
    embed.add_field(name="lane", value=ticket.lane, inline=True)
    embed.add_field(name="time", value=took, inline=True)
    embed.add_field(name="asked by", value=f"<@{ticket.requester_id}>" if ticket.requester_id else "—", inline=True)
    if ticket.origin:
        embed.add_field(name="started in", value=f"voice call {shown(ticket.origin, 80)}", inline=True)
    if ticket.error and ticket.output:
        embed.add_field(name="error", value=shown(ticket.error, FIELD_LIMIT - 2), inline=False)
    if ticket.output_cut:
        embed.set_footer(text="the agent's output was longer than the size cap and was cut")
    assert len(embed) <= MESSAGE_LIMIT
    return embed


def output_pages(ticket: RunTicket, page_chars: int = 3900) -> list[str]:
    """A run's whole output in pieces that each fit one embed description, each shown as text (escaped,
    no control characters)."""
    text = printable((ticket.output or ticket.error or "").strip())
    pages = []
    while text:
        page, room = escaped_within(lambda room, rest=text: rest[:room], page_chars)
        pages.append(page)
        text = text[room:]
    return pages or [""]


def runs_list_embed(tickets: list[RunTicket], now: float) -> discord.Embed:
    embed = discord.Embed(title="Background runs", colour=0x5865F2)
    if not tickets:
        embed.description = "No runs yet. Ask the assistant in a call to start one."
        return embed
    lines = [f"**{t.id}** · {STATE_WORDS[t.state]} · {t.lane} · {elapsed_words(t.elapsed(t.finished_at or now))} · "
             f"{shown(t.task, 80)}" for t in tickets]
    text = ""
    for line in lines:
        if len(text) + len(line) + 1 > DESCRIPTION_LIMIT - 40:
            text += "\n…"
            break
        text += ("\n" if text else "") + line
    embed.description = text
    return embed


def refusal_embed(text: str) -> discord.Embed:
    return discord.Embed(description=bounded(text, DESCRIPTION_LIMIT - 2), colour=0xED4245)


def info_embed(title: str, text: str, *, colour: int = 0x5865F2) -> discord.Embed:
    return discord.Embed(title=bounded(title, TITLE_LIMIT - 2), description=bounded(text, DESCRIPTION_LIMIT - 2),
                         colour=colour)
