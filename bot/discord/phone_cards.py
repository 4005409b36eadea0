"""Phone calls in Discord: a card per call in SWITCHBOARD_TRANSCRIPTS_CHANNEL_ID, then each job's result
as a reply under it (or in the job's own channel, linking back to the card).

Nobody is ever pinged (allowed mentions: none). Transcript content shown here is the caller's words:
external, untrusted data, shown as data. A failed card raises, so the pipeline records the stage and
the next delivery of the event posts it again; a failed result is kept in the execution ledger.
"""

from __future__ import annotations

import asyncio
import logging

import discord

from bot.discord.embeds import COLOURS, FIELD_LIMIT, MESSAGE_LIMIT, TITLE_LIMIT, fitted
from bot.discord.posts import PostError, send
from bot.discord.untrusted import escape_caller_text
from bot.phone.delivery import (
    KIND_WORDS,
    JobResult,
    card_reference,
    card_summary,
    card_title,
    parse_reference,
)
from listener.pipeline import CallCard
from runs.wording import STATE_WORDS, bounded, elapsed_words

log = logging.getLogger(__name__)

CARD_COLOUR = 0x5865F2
CONNECT_WAIT_S = 60.0


def card_embed(card: CallCard) -> discord.Embed:
    embed = discord.Embed(title=bounded(escape_caller_text(card_title(card)), TITLE_LIMIT - 40), colour=CARD_COLOUR,
                          description=bounded(escape_caller_text(card_summary(card)), 1000))
    embed.add_field(name="when", value=f"<t:{int(card.received_at)}:f>", inline=True)
    embed.add_field(name="direction", value=card.direction or "unknown", inline=True)
    if card.duration_s:
        embed.add_field(name="length", value=elapsed_words(card.duration_s), inline=True)
    if card.facts:
        embed.add_field(name="learned", value=fitted([f"• {bounded(escape_caller_text(f), 200)}" for f in card.facts], FIELD_LIMIT), inline=False)
    jobs = [f"`{job_id}` {KIND_WORDS.get(kind, kind)}: {bounded(escape_caller_text(label), 80)}" + (
        " (could not start yet; retried with the next delivery)" if job_id == "not started" else "")
        for job_id, kind, label in card.jobs]
    embed.add_field(name="jobs", value=fitted(jobs, FIELD_LIMIT) if jobs else "none", inline=False)
    embed.set_footer(text=f"call {bounded(escape_caller_text(card.conversation_id), 80)} · /transcripts show id:{card.transcript_id}")
    assert len(embed) <= MESSAGE_LIMIT, len(embed)
    return embed




def result_embed(result: JobResult, *, description_limit: int = 3500) -> discord.Embed:
    ticket = result.ticket
    kind = KIND_WORDS.get(result.kind, result.kind)
    head = f"{kind.capitalize()}: " if result.kind != "command" else "Call command: "
    embed = discord.Embed(title=head + bounded(escape_caller_text(result.label), TITLE_LIMIT - 40 - len(head)),
                          colour=COLOURS[ticket.state])
    body = (ticket.output or ticket.error or "").strip()
    if len(body) > description_limit:
        body = body[: description_limit - 80].rstrip() + f"\n… cut here; `/runs show {ticket.id}` pages the rest"
    embed.description = body or None
    embed.add_field(name="state", value=STATE_WORDS[ticket.state], inline=True)
    embed.add_field(name="run", value=str(ticket.id), inline=True)
    embed.add_field(name="call", value=bounded(escape_caller_text(result.conversation_id), 100), inline=True)
    return embed


class DiscordPoster:
    def __init__(self, client: discord.Client, transcripts_channel: int | None) -> None:
        self._client = client
        self.channel_id = transcripts_channel

    async def post_card(self, card: CallCard) -> str | None:
        if self.channel_id is None:
            log.info("call %s archived; no SWITCHBOARD_TRANSCRIPTS_CHANNEL_ID is set, so no card is posted",
                     card.conversation_id)
            return "not posted: no SWITCHBOARD_TRANSCRIPTS_CHANNEL_ID"
        message = await self._send(self.channel_id, embed=card_embed(card))
        return card_reference(self.channel_id, message.id)

    async def post_result(self, result: JobResult) -> str:
        if result.channel_id is None:
            log.info("%s %r for call %s finished (run %s); its target is local, so it is kept in the archive only",
                     result.kind, result.label, result.conversation_id, result.ticket.id)
            return "local"
        card = parse_reference(result.card)
        reference = None
        embed = result_embed(result)
        if card is not None and card[0] == result.channel_id:
            reference = discord.MessageReference(message_id=card[1], channel_id=card[0], fail_if_not_exists=False)
        elif card is not None:
            guild = next((g.id for g in self._client.guilds if g.get_channel(card[0]) is not None), None)
            if guild is not None:
                embed.add_field(name="card", value=f"https://discord.com/channels/{guild}/{card[0]}/{card[1]}",
                                inline=False)
        await self._send(result.channel_id, embed=embed, reference=reference)
        return f"posted in channel {result.channel_id}"

    async def _send(self, channel_id: int, **kwargs) -> discord.Message:
        connected = getattr(self._client, "connected", None)  # runs may land before the gateway is ready
        if connected is not None and not connected.is_set():
            try:
                await asyncio.wait_for(connected.wait(), CONNECT_WAIT_S)
            except TimeoutError:
                raise PostError("Discord is not connected yet") from None
        return await send(self._client, channel_id, **kwargs)
