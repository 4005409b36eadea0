"""/runs list|show|stop: the background runs, in the home server only.

Reading is open to anyone there (answers are ephemeral); stopping a run is for operators.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot.discord.checks import HomeGuildGroup, operator_only, refuse
from bot.discord.embeds import info_embed, output_pages, refusal_embed, run_embed, runs_list_embed
from common.visible import plain_line
from runs import Refused, UnknownRun
from runs.wording import STATE_WORDS, bounded

if TYPE_CHECKING:
    from bot.discord.commands.context import CommandContext


class RunsGroup(HomeGuildGroup):
    def __init__(self, ctx: CommandContext) -> None:
        super().__init__(name="runs", description="Background runs: list, show, stop", guild_only=True)
        self.ctx = ctx

    async def _run_numbers(self, interaction: discord.Interaction, current: int | str | None
                           ) -> list[app_commands.Choice[int]]:
        typed = str(current or "")
        tickets = await self.ctx.runs.tickets(25)
        return [app_commands.Choice(name=bounded(plain_line(f"{t.id}: {STATE_WORDS[t.state]} · {t.task}"), 98),
                                    value=t.id)
                for t in tickets if str(t.id).startswith(typed)][:25]

    @app_commands.command(name="list", description="Recent background runs, newest first")
    async def list_(self, interaction: discord.Interaction) -> None:
        tickets = await self.ctx.runs.tickets(20)
        await interaction.response.send_message(embed=runs_list_embed(tickets, time.time()), ephemeral=True)

    @app_commands.command(name="show", description="One run: state, output, who asked")
    @app_commands.describe(run="the run number", page="which page of the output (default 1)")
    async def show(self, interaction: discord.Interaction, run: app_commands.Range[int, 1],
                   page: app_commands.Range[int, 1] = 1) -> None:
        try:
            ticket = await self.ctx.runs.get(run)
        except UnknownRun:
            await refuse(interaction, f"There is no run {run}; `/runs list` shows the numbers.")
            return
        pages = output_pages(ticket)
        if page > len(pages):
            await refuse(interaction, f"Run {run}'s output has {len(pages)} page(s).")
            return
        embed = run_embed(ticket, time.time(), description_limit=4000)
        if len(pages) > 1:
            embed.description = pages[page - 1]
            embed.set_footer(text=f"page {page} of {len(pages)}: `/runs show run:{run} page:{page + 1}` for more"
                             if page < len(pages) else f"page {page} of {len(pages)}")
        await interaction.response.send_message(embed=embed, ephemeral=True)

    @app_commands.command(name="stop", description="Stop a background run (operators)")
    @app_commands.describe(run="the run number", reason="why, in a few words")
    @operator_only("stop a run")
    async def stop(self, interaction: discord.Interaction, run: app_commands.Range[int, 1],
                   reason: str | None = None) -> None:
        await interaction.response.defer(thinking=True)
        try:
            result = await self.ctx.runs.stop(run, reason or f"stopped with /runs stop by {interaction.user.id}",
                                              interaction.user.id)
        except UnknownRun:
            await refuse(interaction, f"There is no run {run}; `/runs list` shows the numbers.")
            return
        if isinstance(result, Refused):
            await interaction.followup.send(embed=refusal_embed(result.reason))
            return
        await interaction.followup.send(embed=info_embed(f"Run {run}", result.summary))

    show.autocomplete("run")(_run_numbers)
    stop.autocomplete("run")(_run_numbers)
