"""/talk join|leave|mode|captions|status: the assistant in a voice channel.

Every command answers only in the home server(s), as `/runs` does (`HomeGuildGroup`: the model, the
voice and the agent lanes are the owner's business). Changing the call (join, leave, mode, captions) is
for operators (`operator_only`, on the invoking user's immutable id); `status` is for anyone there.
Joining defers first: connecting can take longer than Discord's 3 s first-response window.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

import discord
from discord import app_commands

from bot.discord.checks import HomeGuildGroup, operator_only, refuse
from bot.discord.embeds import info_embed, refusal_embed

if TYPE_CHECKING:
    from bot.discord.commands.context import CommandContext

log = logging.getLogger(__name__)


class TalkGroup(HomeGuildGroup):
    def __init__(self, ctx: CommandContext) -> None:
        super().__init__(name="talk", description="Talk with the assistant in a voice channel", guild_only=True)
        self.ctx = ctx

    @app_commands.command(name="join", description="Join a voice channel and start talking (operators)")
    @app_commands.describe(channel="the voice channel (default: the one you are in)")
    @operator_only("make me join a voice channel")
    async def join(self, interaction: discord.Interaction,
                   channel: discord.VoiceChannel | discord.StageChannel | None = None) -> None:
        target = channel
        if target is None:
            voice = getattr(interaction.user, "voice", None)
            target = voice.channel if voice is not None else None
        if target is None or interaction.guild is None:
            await refuse(interaction, "Join a voice channel first, or name one: `/talk join channel:#general`.")
            return
        await interaction.response.defer(thinking=True)
        try:
            summary = await self.ctx.calls.join(interaction.guild, target, requested_by=interaction.user.id,
                                                text_channel_id=interaction.channel_id)
        except Exception as exc:  # the user gets one line, the log gets the rest
            log.exception("joining %s failed", target.id)
            await interaction.followup.send(embed=refusal_embed(f"I could not join {target.mention}: {exc}"))
            return
        await interaction.followup.send(embed=info_embed("In the call", summary, colour=0x57F287))

    @app_commands.command(name="leave", description="Leave the voice channel (operators)")
    @operator_only("make me leave")
    async def leave(self, interaction: discord.Interaction) -> None:
        if interaction.guild is None or not self.ctx.calls.active(interaction.guild.id):
            await refuse(interaction, "I am not in a voice channel here.")
            return
        await interaction.response.defer(thinking=True)
        summary = await self.ctx.calls.leave(interaction.guild.id, reason=f"/talk leave by {interaction.user.id}")
        await interaction.followup.send(embed=info_embed("Left the call", summary))

    @app_commands.command(name="mode", description="Answer everyone, or only when addressed by name (operators)")
    @app_commands.describe(mode="everyone: answer every turn; addressed: only turns that start with my name")
    @operator_only("change how I answer")
    async def mode(self, interaction: discord.Interaction, mode: Literal["everyone", "addressed"]) -> None:
        try:
            summary = self.ctx.calls.set_mode(interaction.guild_id or 0, mode)
        except LookupError as exc:
            await refuse(interaction, str(exc))
            return
        await interaction.response.send_message(embed=info_embed("Answer mode", summary))

    @app_commands.command(name="captions", description="Live captions of this call in a thread (operators)")
    @app_commands.describe(state="on: a thread with a line per turn; off: stop")
    @operator_only("turn captions on or off")
    async def captions(self, interaction: discord.Interaction, state: Literal["on", "off"]) -> None:
        if interaction.guild is None or not self.ctx.calls.active(interaction.guild.id):
            await refuse(interaction, "I am not in a voice channel here.")
            return
        await interaction.response.defer(thinking=True)
        try:
            summary = await self.ctx.calls.set_captions(interaction.guild, state == "on")
        except LookupError as exc:
            await refuse(interaction, str(exc))
            return
        await interaction.followup.send(embed=info_embed("Captions", summary))

    @app_commands.command(name="status", description="What the call is doing, who has been heard, the agent lanes")
    async def status(self, interaction: discord.Interaction) -> None:
        await interaction.response.defer(ephemeral=True, thinking=True)
        embed = await self.ctx.status_embed(interaction.guild.id if interaction.guild else None)
        await interaction.followup.send(embed=embed, ephemeral=True)
