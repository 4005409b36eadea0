"""/transcripts search|show: the phone-call archive — the owner's — for operators only, in the home
server only (the same rule a call's phone tools follow: `bot.discord.gate.PhoneDataGate`).

Everything an archived call contains is what callers said: external, untrusted text. It is shown
escaped (no markdown, no masked links, no mentions), only to the person who asked (ephemeral), and
every embed says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands

from bot.discord.checks import HomeGuildGroup, operator_only, refuse
from bot.discord.embeds import DESCRIPTION_LIMIT, FIELD_LIMIT, MESSAGE_LIMIT, TITLE_LIMIT, info_embed
from bot.discord.untrusted import untrusted
from listener.archive import ArchiveError
from runs.wording import bounded

if TYPE_CHECKING:
    from bot.discord.commands.context import CommandContext

SEARCH_PAGE = 10
TURN_CHARS = 150  # one search result's text
SHOW_PAGE_CHARS = 3600  # turn lines per /transcripts show page (plus fields, title, footer: < 6000)
UNTRUSTED = "What callers said: external, untrusted text, never instructions"


def cut(text: str, limit: int) -> str:
    """At most `limit` characters, keeping line breaks (a review reads better with them)."""
    text = (text or "").strip()
    return text if len(text) <= limit else text[: limit - 2].rstrip() + " …"


def speaker_words(speaker: str, is_user: bool) -> str:
    return f"{untrusted(speaker, 40)}{' (you)' if is_user else ''}"


def pages_of(lines: list[str], page_chars: int = SHOW_PAGE_CHARS) -> list[str]:
    """Lines packed into pages of at most `page_chars`; a line longer than a page is split."""
    pages, page = [], ""
    for line in lines:
        while len(line) > page_chars:
            if page:
                pages.append(page)
                page = ""
            pages.append(line[:page_chars])
            line = line[page_chars:]
        if page and len(page) + 1 + len(line) > page_chars:
            pages.append(page)
            page = ""
        page = f"{page}\n{line}" if page else line
    if page or not pages:
        pages.append(page)
    return pages


def search_embed(found: dict[str, Any], query: str, page: int) -> discord.Embed:
    embed = discord.Embed(title=bounded(f"Calls mentioning “{query}”", TITLE_LIMIT - 2), colour=0x5865F2)
    lines = []
    for r in found["results"]:
        conversation = bounded(r["conversation_id"], 60).replace("`", "'")  # a code span renders nothing
        lines.append(f"**#{r['transcript_id']}** · `{conversation}` · "
                     f"<t:{int(r['received_at'])}:d> · turn {r['turn_index']} "
                     f"**{speaker_words(r['speaker'], r['is_user'])}**: {untrusted(r['text'], TURN_CHARS)}")
    embed.description = "\n".join(lines)[: DESCRIPTION_LIMIT - 2]
    footer = f"{UNTRUSTED}. Page {page}."
    if found.get("next_offset") is not None:
        footer += f" More: /transcripts search query:{bounded(query, 80)} page:{page + 1}"
    embed.set_footer(text=footer)
    return embed


def call_title(call: dict[str, Any]) -> str:
    who = f"{call.get('from') or 'unknown number'} → {call.get('to') or 'unknown number'}"
    direction = (call.get("direction") or "").lower()
    kind = {"inbound": "Inbound call", "outbound": "Outbound call"}.get(direction, "Call")
    return bounded(f"{kind} #{call['id']}: {untrusted(who)}", TITLE_LIMIT - 2)


def call_embed(call: dict[str, Any], pages: list[str], page: int, review: str | None) -> discord.Embed:
    embed = discord.Embed(title=call_title(call), colour=0x5865F2,
                          description=pages[page - 1] or "This call has no turns.")
    embed.add_field(name="when", value=f"<t:{int(call['received_at'])}:f>", inline=True)
    embed.add_field(name="direction", value=call.get("direction") or "unknown", inline=True)
    embed.add_field(name="review status", value=call.get("review_status") or "none", inline=True)
    embed.add_field(name="conversation", value=untrusted(call["conversation_id"], 200) or "?", inline=True)
    if review and review.strip():
        embed.add_field(name="review", value=cut(review, FIELD_LIMIT), inline=False)
    footer = f"page {page} of {len(pages)} · {UNTRUSTED}"
    if page < len(pages):
        footer += f" · more: /transcripts show id:{call['id']} page:{page + 1}"
    embed.set_footer(text=footer)
    assert len(embed) <= MESSAGE_LIMIT
    return embed


class TranscriptsGroup(HomeGuildGroup):
    def __init__(self, ctx: CommandContext) -> None:
        super().__init__(name="transcripts", description="Archived phone calls: search, show", guild_only=True)
        self.ctx = ctx

    @app_commands.command(name="search", description="Archived call turns with all these words, best first")
    @app_commands.describe(query="words from the call: a name, a number, a phrase",
                           page="which page of results (default 1)")
    @operator_only("read the phone calls")
    async def search(self, interaction: discord.Interaction, query: app_commands.Range[str, 1, 200],
                     page: app_commands.Range[int, 1, 1000] = 1) -> None:
        try:
            found = await self.ctx.archive.search(query, limit=SEARCH_PAGE, offset=(page - 1) * SEARCH_PAGE)
        except ArchiveError as exc:
            await refuse(interaction, f"I cannot search for that: {exc}.")
            return
        if not found["results"]:
            text = ("No archived call turn has all those words." if page == 1 else
                    f"There is no page {page}: the results end before it.")
            await interaction.response.send_message(embed=info_embed("Transcripts", text), ephemeral=True)
            return
        await interaction.response.send_message(embed=search_embed(found, query, page), ephemeral=True)

    @app_commands.command(name="show", description="One archived call, every turn")
    @app_commands.rename(ref="id")
    @app_commands.describe(ref="the archive id (#n in search) or the conversation id",
                           page="which page of the turns (default 1)")
    @operator_only("read the phone calls")
    async def show(self, interaction: discord.Interaction, ref: app_commands.Range[str, 1, 200],
                   page: app_commands.Range[int, 1, 1000] = 1) -> None:
        try:
            call = await self.ctx.archive.show(ref.strip().lstrip("#"))
        except ArchiveError:
            await refuse(interaction, f"There is no archived call {bounded(ref, 80)!r}: "
                                       "`/transcripts search` finds calls by what was said.")
            return
        lines = [f"**[{t['index']}] {speaker_words(t['speaker'], t['is_user'])}**: {untrusted(t['text'])}"
                 for t in call["turns"]]
        pages = pages_of(lines)
        if page > len(pages):
            await refuse(interaction, f"Call #{call['id']} has {len(pages)} page(s) of turns.")
            return
        review = await self.ctx.archive.review_of(call["id"])
        await interaction.response.send_message(embed=call_embed(call, pages, page, review), ephemeral=True)
