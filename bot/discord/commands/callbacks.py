"""/callbacks list|register|update|enable|disable|remove: what runs after each phone call, in the home
server only.

Reading is open to anyone there; changing a callback is for operators (`operator_only`, on the
invoking user's immutable id — never a name) and is confirmed in the channel so everyone sees what
runs after each call. A `discord:<channel id>` deliver target is checked against Discord too: the
channel must be a text channel of this server the bot can post embeds in.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot.discord.checks import HomeGuildGroup, operator_only, refuse
from bot.discord.embeds import DESCRIPTION_LIMIT, FIELD_LIMIT, OK, info_embed
from bot.discord.posts import NO_PINGS
from listener.callbacks import Callback, CallbackError, check_deliver
from runs.wording import bounded

if TYPE_CHECKING:
    from bot.discord.commands.context import CommandContext

log = logging.getLogger(__name__)



class Refused(Exception):
    """A change that is not made; the message is for the user."""


def deliver_words(deliver: str, default_channel: int | None) -> str:
    if deliver.startswith("discord:"):
        return f"<#{deliver.split(':', 1)[1]}>"
    if deliver == "local":
        return "nowhere (archive and log only)"
    return "the transcripts channel" + (f" (<#{default_channel}>)" if default_channel else "")


def callbacks_embed(callbacks: list[Callback], default_channel: int | None) -> discord.Embed:
    embed = discord.Embed(title="Post-call callbacks", colour=0x5865F2)
    if not callbacks:
        embed.description = ("No callbacks yet: nothing runs after a phone call but archiving it. "
                             "An operator adds one with `/callbacks register`.")
        return embed
    text = ""
    for c in callbacks:
        entry = (f"**{c.id}** · {bounded(c.name, 80)} · {'enabled' if c.enabled else 'disabled'} · "
                 f"delivers to {deliver_words(c.deliver, default_channel)} · revision {c.revision}\n"
                 f"> {discord.utils.escape_mentions(bounded(c.instructions, 200))}")
        if len(text) + len(entry) + 2 > DESCRIPTION_LIMIT - 40:
            text += "\n…"
            break
        text += ("\n" if text else "") + entry
    embed.description = text
    embed.set_footer(text="Each enabled callback runs once after each new call; operators change them.")
    return embed


def callback_embed(callback: Callback, action: str, user_id: int, default_channel: int | None) -> discord.Embed:
    embed = info_embed(f"Callback {callback.id} {action}",
                       f"<@{user_id}> {action} **{bounded(callback.name, 80)}** (`{callback.id}`).",
                       colour=OK if action != "removed" else 0x95A5A6)
    if action != "removed":
        embed.add_field(name="state", value="enabled" if callback.enabled else "disabled", inline=True)
        embed.add_field(name="delivers to", value=deliver_words(callback.deliver, default_channel), inline=True)
        embed.add_field(name="revision", value=str(callback.revision), inline=True)
        embed.add_field(name="instructions", value=bounded(callback.instructions, FIELD_LIMIT - 2), inline=False)
    return embed


class CallbacksGroup(HomeGuildGroup):
    def __init__(self, ctx: CommandContext) -> None:
        super().__init__(name="callbacks", description="Post-call callbacks: what runs after each phone call",
                         guild_only=True)
        self.ctx = ctx

    @property
    def _default_channel(self) -> int | None:
        return self.ctx.settings.transcripts_channel_id

    async def _callback_ids(self, interaction: discord.Interaction, current: str
                            ) -> list[app_commands.Choice[str]]:
        typed = (current or "").strip().lower()
        callbacks = await self.ctx.callbacks.list()
        return [app_commands.Choice(name=bounded(f"{c.id}: {c.name} ({'on' if c.enabled else 'off'})", 98),
                                    value=c.id)
                for c in callbacks if typed in c.id or typed in c.name.lower()][:25]

    def _deliver(self, interaction: discord.Interaction, value: str) -> str:
        """The normalised target, checked against Discord when it names a channel (Refused if not)."""
        try:
            target = check_deliver(value)
        except CallbackError as exc:
            raise Refused(str(exc)) from None
        if not target.startswith("discord:"):
            return target
        channel_id = int(target.split(":", 1)[1])
        guild = interaction.guild
        if guild is None:
            raise Refused("Name a Discord channel from inside its server, so I can check I may post there.")
        channel = guild.get_channel(channel_id)
        if channel is None:
            raise Refused(f"There is no channel {channel_id} in this server: copy the ID of one of its text "
                          "channels (Developer Mode, right-click the channel, Copy Channel ID).")
        if not isinstance(channel, discord.TextChannel):
            raise Refused(f"{channel.mention} is not a text channel: callback results are posted as messages.")
        me = guild.me
        if me is not None:
            allowed = channel.permissions_for(me)
            missing = [name for name, ok in (("View Channel", allowed.view_channel),
                                             ("Send Messages", allowed.send_messages),
                                             ("Embed Links", allowed.embed_links)) if not ok]
            if missing:
                raise Refused(f"I may not post in {channel.mention}: I need {', '.join(missing)} there. "
                              "Give me those permissions, or pick another channel.")
        return target

    async def _confirm(self, interaction: discord.Interaction, callback: Callback, action: str) -> None:
        log.info("callback %s %s by %s (revision %d)", callback.id, action, interaction.user.id, callback.revision)
        await interaction.response.send_message(
            embed=callback_embed(callback, action, interaction.user.id, self._default_channel),
            allowed_mentions=NO_PINGS)

    @app_commands.command(name="list", description="Every callback: what it does, where it reports")
    async def list_(self, interaction: discord.Interaction) -> None:
        callbacks = await self.ctx.callbacks.list()
        await interaction.response.send_message(embed=callbacks_embed(callbacks, self._default_channel),
                                                ephemeral=True)

    @app_commands.command(name="register", description="Add a callback that runs after each call (operators)")
    @app_commands.rename(callback_id="id")
    @app_commands.describe(callback_id="a short id: lowercase letters, digits, - or _ (e.g. calendar-events)",
                           name="what it is called in Discord", instructions="what to do with each call",
                           deliver="local, discord:<channel id>, or leave out for the transcripts channel")
    @operator_only("register a callback")
    async def register(self, interaction: discord.Interaction, callback_id: app_commands.Range[str, 1, 40],
                       name: app_commands.Range[str, 1, 80], instructions: app_commands.Range[str, 1, 4000],
                       deliver: app_commands.Range[str, 1, 100] | None = None) -> None:
        try:
            target = self._deliver(interaction, deliver or "")
            callback = await self.ctx.callbacks.register(callback_id, name, instructions, target)
        except (Refused, CallbackError) as exc:
            await refuse(interaction, str(exc))
            return
        await self._confirm(interaction, callback, "registered")

    @app_commands.command(name="update", description="Change a callback's name, instructions or target (operators)")
    @app_commands.rename(callback_id="id")
    @app_commands.describe(callback_id="the callback", name="a new name", instructions="new instructions",
                           deliver="local, discord:<channel id>, or default (the transcripts channel)")
    @operator_only("change a callback")
    async def update(self, interaction: discord.Interaction, callback_id: app_commands.Range[str, 1, 40],
                     name: app_commands.Range[str, 1, 80] | None = None,
                     instructions: app_commands.Range[str, 1, 4000] | None = None,
                     deliver: app_commands.Range[str, 1, 100] | None = None) -> None:
        if name is None and instructions is None and deliver is None:
            await refuse(interaction, "Say what to change: name, instructions or deliver.")
            return
        try:
            target = None if deliver is None else self._deliver(interaction, deliver)
            callback = await self.ctx.callbacks.update(callback_id, name=name, instructions=instructions,
                                                      deliver=target)
        except (Refused, CallbackError) as exc:
            await refuse(interaction, str(exc))
            return
        await self._confirm(interaction, callback, "updated")

    async def _switch(self, interaction: discord.Interaction, callback_id: str, enabled: bool) -> None:
        try:
            callback = await self.ctx.callbacks.set_enabled(callback_id, enabled)
        except CallbackError as exc:
            await refuse(interaction, str(exc))
            return
        await self._confirm(interaction, callback, "enabled" if enabled else "disabled")

    @app_commands.command(name="enable", description="Run a callback after each call again (operators)")
    @app_commands.rename(callback_id="id")
    @app_commands.describe(callback_id="the callback")
    @operator_only("enable a callback")
    async def enable(self, interaction: discord.Interaction, callback_id: app_commands.Range[str, 1, 40]) -> None:
        await self._switch(interaction, callback_id, True)

    @app_commands.command(name="disable", description="Stop running a callback, keeping it (operators)")
    @app_commands.rename(callback_id="id")
    @app_commands.describe(callback_id="the callback")
    @operator_only("disable a callback")
    async def disable(self, interaction: discord.Interaction, callback_id: app_commands.Range[str, 1, 40]) -> None:
        await self._switch(interaction, callback_id, False)

    @app_commands.command(name="remove", description="Delete a callback (operators)")
    @app_commands.rename(callback_id="id")
    @app_commands.describe(callback_id="the callback")
    @operator_only("remove a callback")
    async def remove(self, interaction: discord.Interaction, callback_id: app_commands.Range[str, 1, 40]) -> None:
        try:
            callback = await self.ctx.callbacks.remove(callback_id)
        except CallbackError as exc:
            await refuse(interaction, str(exc))
            return
        await self._confirm(interaction, callback, "removed")

    update.autocomplete("callback_id")(_callback_ids)
    enable.autocomplete("callback_id")(_callback_ids)
    disable.autocomplete("callback_id")(_callback_ids)
    remove.autocomplete("callback_id")(_callback_ids)
