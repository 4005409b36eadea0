"""What the slash-command groups use of the running service: a small protocol the Discord client
implements, so a group depends on these few things and never on the client class."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import discord

if TYPE_CHECKING:
    from bot.discord.calls import CallManager
    from bot.discord.gate import OperatorGate
    from bot.settings import Settings
    from listener.archive import Archive
    from listener.callbacks import Callbacks
    from runs import RunService


class CommandContext(Protocol):
    settings: Settings
    gate: OperatorGate
    calls: CallManager

    @property
    def runs(self) -> RunService: ...

    @property
    def archive(self) -> Archive: ...

    @property
    def callbacks(self) -> Callbacks: ...

    async def status_embed(self, guild_id: int | None) -> discord.Embed: ...
