"""Who may use a slash command, as discord.py checks, and the tree's one error handler.

- `operator_only(action)`: the invoking user's immutable id must be in SWITCHBOARD_OPERATOR_USER_IDS
  (the operator gate) — never a name.
- `HomeGuildGroup`: a command group whose commands answer only in a server, and only in
  SWITCHBOARD_GUILD_IDS when it is set (runs and phone calls are the owner's, not every server's).

A check that fails raises a `Refusal` (a `CheckFailure` whose message says what to do);
`on_command_error` turns it into one ephemeral sentence. Anything else a command raises is logged
and answered with one line, never a traceback in Discord.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

import discord
from discord import app_commands

from bot.discord.embeds import refusal_embed
from bot.discord.gate import in_home_guild

if TYPE_CHECKING:
    from bot.discord.commands.context import CommandContext
    from bot.discord.gate import OperatorGate

log = logging.getLogger(__name__)

T = TypeVar("T")


class Refusal(app_commands.CheckFailure):
    """A command that is not done; the message is the sentence the user reads."""


class NotOperator(Refusal):
    pass


class OutsideHomeGuild(Refusal):
    pass


def context_of(interaction: discord.Interaction) -> CommandContext:
    """The running service, as the command groups see it (the client implements `CommandContext`)."""
    return cast("CommandContext", interaction.client)


def operator_refusal(gate: OperatorGate, user_id: int, action: str) -> str:
    if not gate.operators:
        return (f"Only an operator can {action}, and none is configured: add Discord user IDs (yours is "
                f"{user_id}) to SWITCHBOARD_OPERATOR_USER_IDS and restart Switchboard.")
    return f"Only an operator can {action}. Ask one of them, or have your user ID ({user_id}) added."


def operator_only(action: str) -> Callable[[T], T]:
    """A check: only an operator may `action` (said in the refusal: "Only an operator can …")."""

    def predicate(interaction: discord.Interaction) -> bool:
        gate = context_of(interaction).gate
        if gate.is_operator(interaction.user.id):
            return True
        raise NotOperator(operator_refusal(gate, interaction.user.id, action))

    return app_commands.check(predicate)


def home_guild_refusal(guild_id: int | None, allowed: frozenset[int] | set[int]) -> str | None:
    """Why a command is not available where it was used, or None when it is."""
    if in_home_guild(guild_id, allowed):
        return None
    where = "in a direct message" if guild_id is None else "in this server"
    return (f"This is not available {where}: it belongs to the server Switchboard serves"
            + (" (SWITCHBOARD_GUILD_IDS)." if allowed else "."))


class HomeGuildGroup(app_commands.Group):
    """A group whose every command answers only in the home server(s)."""

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        if problem := home_guild_refusal(interaction.guild_id, context_of(interaction).settings.guild_ids):
            raise OutsideHomeGuild(problem)
        return True


async def refuse(interaction: discord.Interaction, text: str) -> None:
    """One ephemeral refusal, whether or not the interaction has been answered (deferred) already."""
    if interaction.response.is_done():
        await interaction.followup.send(embed=refusal_embed(text), ephemeral=True)
    else:
        await interaction.response.send_message(embed=refusal_embed(text), ephemeral=True)


async def on_command_error(interaction: discord.Interaction, error: app_commands.AppCommandError) -> None:
    """The command tree's error handler: a refusal is said as is; anything else is logged, and the user
    gets one line."""
    if isinstance(error, Refusal):
        await refuse(interaction, str(error))
        return
    name = interaction.command.qualified_name if interaction.command else "?"
    log.error("/%s failed", name, exc_info=error)
    try:
        await refuse(interaction, f"/{name} failed: {type(getattr(error, 'original', error)).__name__}. "
                                  "The log has the details.")
    except discord.HTTPException:
        log.warning("could not tell the user that /%s failed", name)
