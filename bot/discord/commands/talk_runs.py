"""Slash commands, one `app_commands.Group` per topic: /talk join|leave|status, /runs list|show|stop.

Replies are embeds; refusals are ephemeral and say what to do; anything that may take longer than
Discord's 3 s first-response window defers first. Who may change things is decided by the operator
gate on the invoking user's immutable id — never on a name.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Literal

import discord
from discord import app_commands

from bot.discord.embeds import info_embed, output_pages, refusal_embed, run_embed, runs_list_embed
from runs import UnknownRun
from runs.wording import STATE_WORDS, bounded

if TYPE_CHECKING:
    from bot.discord.client import SwitchboardBot

log = logging.getLogger(__name__)


def _operator_refusal(bot: SwitchboardBot, user: discord.abc.User, action: str) -> str:
    if not bot.gate.operators:
        return (f"Only an operator can {action}, and none is configured: add Discord user IDs (yours is "
                f"{user.id}) to SWITCHBOARD_OPERATOR_USER_IDS and restart Switchboard.")
    return f"Only an operator can {action}. Ask one of them, or have your user ID ({user.id}) added."


async def _refuse(interaction: discord.Interaction, text: str) -> None:
    if interaction.response.is_done():
        await interaction.followup.send(embed=refusal_embed(text), ephemeral=True)
    else:
        await interaction.response.send_message(embed=refusal_embed(text), ephemeral=True)


async def in_home_guild(bot: SwitchboardBot, interaction: discord.Interaction) -> bool:
    """Runs and phone calls are the owner's: only in a server, and only in SWITCHBOARD_GUILD_IDS when it
    is set. Refuses (ephemerally) and returns False anywhere else — a DM, another server the bot is in."""
    guild_id = interaction.guild_id
    allowed = bot.settings.guild_ids
    if guild_id is not None and (not allowed or guild_id in allowed):
        return True
    where = "in a direct message" if guild_id is None else "in this server"
    await _refuse(interaction, f"This is not available {where}: it belongs to the server Switchboard serves"
                  + (" (SWITCHBOARD_GUILD_IDS)." if allowed else "."))
    return False


class TalkGroup(app_commands.Group):
    def __init__(self, bot: SwitchboardBot) -> None:
        super().__init__(name="talk", description="Talk with the assistant in a voice channel", guild_only=True)
        self.bot = bot

    @app_commands.command(name="join", description="Join a voice channel and start talking (operators)")
    @app_commands.describe(channel="the voice channel (default: the one you are in)")
    async def join(self, interaction: discord.Interaction,
                   channel: discord.VoiceChannel | discord.StageChannel | None = None) -> None:
        if not self.bot.gate.is_operator(interaction.user.id):
            await _refuse(interaction, _operator_refusal(self.bot, interaction.user, "make me join a voice channel"))
            return
        target = channel
        if target is None:
            voice = getattr(interaction.user, "voice", None)
            target = voice.channel if voice is not None else None
        if target is None or interaction.guild is None:
            await _refuse(interaction, "Join a voice channel first, or name one: `/talk join channel:#general`.")
            return
        await interaction.response.defer(thinking=True)
        try:
            summary = await self.bot.calls.join(interaction.guild, target, requested_by=interaction.user.id,
                                                text_channel_id=interaction.channel_id)
        except Exception as exc:  # the user gets one line, the log gets the rest
            log.exception("joining %s failed", target.id)
            await interaction.followup.send(embed=refusal_embed(f"I could not join {target.mention}: {exc}"))
            return
        await interaction.followup.send(embed=info_embed("In the call", summary, colour=0x57F287))

    @app_commands.command(name="leave", description="Leave the voice channel (operators)")
    async def leave(self, interaction: discord.Interaction) -> None:
        if not self.bot.gate.is_operator(interaction.user.id):
            await _refuse(interaction, _operator_refusal(self.bot, interaction.user, "make me leave"))
            return
        if interaction.guild is None or not self.bot.calls.active(interaction.guild.id):
            await _refuse(interaction, "I am not in a voice channel here.")
            return
        await interaction.response.defer(thinking=True)
        summary = await self.bot.calls.leave(interaction.guild.id, reason=f"/talk leave by {interaction.user.id}")
        await interaction.followup.send(embed=info_embed("Left the call", summary))

    @app_commands.command(name="mode", description="Answer everyone, or only when addressed by name (operators)")
    @app_commands.describe(mode="everyone: answer every turn; addressed: only turns that start with my name")
    async def mode(self, interaction: discord.Interaction, mode: Literal["everyone", "addressed"]) -> None:
        if not self.bot.gate.is_operator(interaction.user.id):
            await _refuse(interaction, _operator_refusal(self.bot, interaction.user, "change how I answer"))
            return
        try:
            summary = self.bot.calls.set_mode(interaction.guild_id or 0, mode)
        except LookupError as exc:
            await _refuse(interaction, str(exc))
            return
        await interaction.response.send_message(embed=info_embed("Answer mode", summary))

    @app_commands.command(name="captions", description="Live captions of this call in a thread (operators)")
    @app_commands.describe(state="on: a thread with a line per turn; off: stop")
    async def captions(self, interaction: discord.Interaction, state: Literal["on", "off"]) -> None:
        if not self.bot.gate.is_operator(interaction.user.id):
            await _refuse(interaction, _operator_refusal(self.bot, interaction.user, "turn captions on or off"))
            return
        if interaction.guild is None or not self.bot.calls.active(interaction.guild.id):
            await _refuse(interaction, "I am not in a voice channel here.")
            return
        await interaction.response.defer(thinking=True)
        try:
            summary = await self.bot.calls.set_captions(interaction.guild, state == "on")
        except LookupError as exc:
            await _refuse(interaction, str(exc))
            return
        await interaction.followup.send(embed=info_embed("Captions", summary))

    @app_commands.command(name="status", description="What the call is doing, who has been heard, the agent lanes")
    async def status(self, interaction: discord.Interaction) -> None:
        await interaction.response.defer(ephemeral=True, thinking=True)
        embed = await self.bot.status_embed(interaction.guild.id if interaction.guild else None)
        await interaction.followup.send(embed=embed, ephemeral=True)


class RunsGroup(app_commands.Group):
    def __init__(self, bot: SwitchboardBot) -> None:
        super().__init__(name="runs", description="Background runs: list, show, stop", guild_only=True)
        self.bot = bot

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        return await in_home_guild(self.bot, interaction)

    async def _run_numbers(self, interaction: discord.Interaction, current: int | str | None
                           ) -> list[app_commands.Choice[int]]:
        typed = str(current or "")
        tickets = await self.bot.runs.tickets(25)
        return [app_commands.Choice(name=bounded(f"{t.id}: {STATE_WORDS[t.state]} · {t.task}", 98), value=t.id)
                for t in tickets if str(t.id).startswith(typed)][:25]

    @app_commands.command(name="list", description="Recent background runs, newest first")
    async def list_(self, interaction: discord.Interaction) -> None:
        tickets = await self.bot.runs.tickets(20)
        await interaction.response.send_message(embed=runs_list_embed(tickets, time.time()), ephemeral=True)

    @app_commands.command(name="show", description="One run: state, output, who asked")
    @app_commands.describe(run="the run number", page="which page of the output (default 1)")
    async def show(self, interaction: discord.Interaction, run: app_commands.Range[int, 1],
                   page: app_commands.Range[int, 1] = 1) -> None:
        try:
            ticket = await self.bot.runs.get(run)
        except UnknownRun:
            await _refuse(interaction, f"There is no run {run}; `/runs list` shows the numbers.")
            return
        pages = output_pages(ticket)
        if page > len(pages):
            await _refuse(interaction, f"Run {run}'s output has {len(pages)} page(s).")
            return
        embed = run_embed(ticket, time.time(), description_limit=4000)
        if len(pages) > 1:
            embed.description = pages[page - 1]
            embed.set_footer(text=f"page {page} of {len(pages)}: `/runs show run:{run} page:{page + 1}` for more"
                             if page < len(pages) else f"page {page} of {len(pages)}")
        await interaction.response.send_message(embed=embed, ephemeral=True)

    @app_commands.command(name="stop", description="Stop a background run (operators)")
    @app_commands.describe(run="the run number", reason="why, in a few words")
    async def stop(self, interaction: discord.Interaction, run: app_commands.Range[int, 1],
                   reason: str | None = None) -> None:
        if not self.bot.gate.is_operator(interaction.user.id):
            await _refuse(interaction, _operator_refusal(self.bot, interaction.user, "stop a run"))
            return
        await interaction.response.defer(thinking=True)
        try:
            result = await self.bot.runs.stop(run, reason or f"stopped with /runs stop by {interaction.user.id}",
                                              interaction.user.id)
        except UnknownRun:
            await _refuse(interaction, f"There is no run {run}; `/runs list` shows the numbers.")
            return
        if "error" in result:
            await interaction.followup.send(embed=refusal_embed(result["error"]))
            return
        await interaction.followup.send(embed=info_embed(f"Run {run}", result["summary"]))

    show.autocomplete("run")(_run_numbers)
    stop.autocomplete("run")(_run_numbers)
