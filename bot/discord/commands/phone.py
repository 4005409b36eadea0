"""Slash commands over the listener's tables: /transcripts search|show, /callbacks list|register|update|
enable|disable|remove.

Everything an archived call contains is what callers said: external, untrusted text. It is shown
escaped (no markdown, no masked links, no mentions), only to the person who asked (ephemeral), and
every embed says so. Reading is open to anyone in the server; changing a callback needs the operator
gate on the invoking user's immutable id — never a name — and is confirmed in the channel so
everyone sees what runs after each call. A `discord:<channel id>` deliver target is checked against
Discord too: the channel must be a text channel of this server the bot can post embeds in.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands

from bot.discord.commands.talk_runs import _operator_refusal, _refuse, in_home_guild
from bot.discord.embeds import DESCRIPTION_LIMIT, FIELD_LIMIT, MESSAGE_LIMIT, OK, TITLE_LIMIT, info_embed
from listener.archive import Archive, ArchiveError
from listener.callbacks import Callback, CallbackError, Callbacks, check_deliver
from runs.wording import bounded

if TYPE_CHECKING:
    from bot.discord.client import SwitchboardBot

log = logging.getLogger(__name__)

SEARCH_PAGE = 10
TURN_CHARS = 150  # one search result's text
SHOW_PAGE_CHARS = 3600  # turn lines per /transcripts show page (plus fields, title, footer: < 6000)
UNTRUSTED = "What callers said: external, untrusted text, never instructions"
NO_PINGS = discord.AllowedMentions.none()


def untrusted(text: str | None, limit: int | None = None) -> str:
    """Caller text for an embed: one line, cut to `limit`, markdown and mentions neutralised."""
    line = bounded(text, limit) if limit is not None else " ".join((text or "").split())
    return discord.utils.escape_mentions(discord.utils.escape_markdown(line))


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


class TranscriptsGroup(app_commands.Group):
    def __init__(self, bot: SwitchboardBot) -> None:
        super().__init__(name="transcripts", description="Archived phone calls: search, show", guild_only=True)
        self.bot = bot

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        return await in_home_guild(self.bot, interaction)

    def _archive(self) -> Archive:
        assert self.bot.store is not None, "the store opens before the gateway"
        return Archive(self.bot.store)

    @app_commands.command(name="search", description="Archived call turns with all these words, best first")
    @app_commands.describe(query="words from the call: a name, a number, a phrase",
                           page="which page of results (default 1)")
    async def search(self, interaction: discord.Interaction, query: app_commands.Range[str, 1, 200],
                     page: app_commands.Range[int, 1, 1000] = 1) -> None:
        try:
            found = await self._archive().search(query, limit=SEARCH_PAGE, offset=(page - 1) * SEARCH_PAGE)
        except ArchiveError as exc:
            await _refuse(interaction, f"I cannot search for that: {exc}.")
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
    async def show(self, interaction: discord.Interaction, ref: app_commands.Range[str, 1, 200],
                   page: app_commands.Range[int, 1, 1000] = 1) -> None:
        try:
            call = await self._archive().show(ref.strip().lstrip("#"))
        except ArchiveError:
            await _refuse(interaction, f"There is no archived call {bounded(ref, 80)!r}: "
                                       "`/transcripts search` finds calls by what was said.")
            return
        lines = [f"**[{t['index']}] {speaker_words(t['speaker'], t['is_user'])}**: {untrusted(t['text'])}"
                 for t in call["turns"]]
        pages = pages_of(lines)
        if page > len(pages):
            await _refuse(interaction, f"Call #{call['id']} has {len(pages)} page(s) of turns.")
            return
        row = await self.bot.store.fetchone("SELECT review FROM transcripts WHERE id = ?", (call["id"],))
        review = row["review"] if row is not None else None
        await interaction.response.send_message(embed=call_embed(call, pages, page, review), ephemeral=True)


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


class CallbacksGroup(app_commands.Group):
    def __init__(self, bot: SwitchboardBot) -> None:
        super().__init__(name="callbacks", description="Post-call callbacks: what runs after each phone call",
                         guild_only=True)
        self.bot = bot

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        return await in_home_guild(self.bot, interaction)

    def _callbacks(self) -> Callbacks:
        assert self.bot.store is not None, "the store opens before the gateway"
        return Callbacks(self.bot.store)

    @property
    def _default_channel(self) -> int | None:
        return self.bot.settings.transcripts_channel_id

    async def _callback_ids(self, interaction: discord.Interaction, current: str
                            ) -> list[app_commands.Choice[str]]:
        typed = (current or "").strip().lower()
        callbacks = await self._callbacks().list()
        return [app_commands.Choice(name=bounded(f"{c.id}: {c.name} ({'on' if c.enabled else 'off'})", 98),
                                    value=c.id)
                for c in callbacks if typed in c.id or typed in c.name.lower()][:25]

    async def _operator(self, interaction: discord.Interaction, action: str) -> bool:
        if self.bot.gate.is_operator(interaction.user.id):
            return True
        await _refuse(interaction, _operator_refusal(self.bot, interaction.user, action))
        return False

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
        callbacks = await self._callbacks().list()
        await interaction.response.send_message(embed=callbacks_embed(callbacks, self._default_channel),
                                                ephemeral=True)

    @app_commands.command(name="register", description="Add a callback that runs after each call (operators)")
    @app_commands.rename(callback_id="id")
    @app_commands.describe(callback_id="a short id: lowercase letters, digits, - or _ (e.g. calendar-events)",
                           name="what it is called in Discord", instructions="what to do with each call",
                           deliver="local, discord:<channel id>, or leave out for the transcripts channel")
    async def register(self, interaction: discord.Interaction, callback_id: app_commands.Range[str, 1, 40],
                       name: app_commands.Range[str, 1, 80], instructions: app_commands.Range[str, 1, 4000],
                       deliver: app_commands.Range[str, 1, 100] | None = None) -> None:
        if not await self._operator(interaction, "register a callback"):
            return
        try:
            target = self._deliver(interaction, deliver or "")
            callback = await self._callbacks().register(callback_id, name, instructions, target)
        except (Refused, CallbackError) as exc:
            await _refuse(interaction, str(exc))
            return
        await self._confirm(interaction, callback, "registered")

    @app_commands.command(name="update", description="Change a callback's name, instructions or target (operators)")
    @app_commands.rename(callback_id="id")
    @app_commands.describe(callback_id="the callback", name="a new name", instructions="new instructions",
                           deliver="local, discord:<channel id>, or default (the transcripts channel)")
    async def update(self, interaction: discord.Interaction, callback_id: app_commands.Range[str, 1, 40],
                     name: app_commands.Range[str, 1, 80] | None = None,
                     instructions: app_commands.Range[str, 1, 4000] | None = None,
                     deliver: app_commands.Range[str, 1, 100] | None = None) -> None:
        if not await self._operator(interaction, "change a callback"):
            return
        if name is None and instructions is None and deliver is None:
            await _refuse(interaction, "Say what to change: name, instructions or deliver.")
            return
        try:
            target = None if deliver is None else self._deliver(interaction, deliver)
            callback = await self._callbacks().update(callback_id, name=name, instructions=instructions,
                                                      deliver=target)
        except (Refused, CallbackError) as exc:
            await _refuse(interaction, str(exc))
            return
        await self._confirm(interaction, callback, "updated")

    async def _switch(self, interaction: discord.Interaction, callback_id: str, enabled: bool) -> None:
        if not await self._operator(interaction, "enable a callback" if enabled else "disable a callback"):
            return
        try:
            callback = await self._callbacks().set_enabled(callback_id, enabled)
        except CallbackError as exc:
            await _refuse(interaction, str(exc))
            return
        await self._confirm(interaction, callback, "enabled" if enabled else "disabled")

    @app_commands.command(name="enable", description="Run a callback after each call again (operators)")
    @app_commands.rename(callback_id="id")
    @app_commands.describe(callback_id="the callback")
    async def enable(self, interaction: discord.Interaction, callback_id: app_commands.Range[str, 1, 40]) -> None:
        await self._switch(interaction, callback_id, True)

    @app_commands.command(name="disable", description="Stop running a callback, keeping it (operators)")
    @app_commands.rename(callback_id="id")
    @app_commands.describe(callback_id="the callback")
    async def disable(self, interaction: discord.Interaction, callback_id: app_commands.Range[str, 1, 40]) -> None:
        await self._switch(interaction, callback_id, False)

    @app_commands.command(name="remove", description="Delete a callback (operators)")
    @app_commands.rename(callback_id="id")
    @app_commands.describe(callback_id="the callback")
    async def remove(self, interaction: discord.Interaction, callback_id: app_commands.Range[str, 1, 40]) -> None:
        if not await self._operator(interaction, "remove a callback"):
            return
        try:
            callback = await self._callbacks().remove(callback_id)
        except CallbackError as exc:
            await _refuse(interaction, str(exc))
            return
        await self._confirm(interaction, callback, "removed")

    update.autocomplete("callback_id")(_callback_ids)
    enable.autocomplete("callback_id")(_callback_ids)
    disable.autocomplete("callback_id")(_callback_ids)
    remove.autocomplete("callback_id")(_callback_ids)

