"""The Discord notification sink: finished runs as embeds in SWITCHBOARD_RUNS_CHANNEL_ID.

A failed post (missing permission, deleted channel, Discord down) is logged and kept for `/talk
status` and `doctor`; it never raises into the runs service, and the run record is untouched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import discord

from bot.discord.embeds import run_embed
from bot.discord.posts import PostError, send
from runs import RunTicket

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PostFailure:
    at: float
    channel_id: int | None
    reason: str


class ChannelSink:
    def __init__(self, client: discord.Client, channel_id: int | None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self.channel_id = channel_id
        self._clock = clock
        self.posted = 0
        self.last_failure: PostFailure | None = None
        # Where each post's outcome is kept (the run's events in the store), for `runs show` and `doctor`.
        self.record: Callable[[int, str, str], Awaitable[None]] | None = None

    async def post_run(self, ticket: RunTicket) -> None:
        if self.channel_id is None:
            log.info("run %s finished; no SWITCHBOARD_RUNS_CHANNEL_ID is set, so it is not posted", ticket.id)
            return
        try:
            await send(self._client, self.channel_id, embed=run_embed(ticket, self._clock()),
                       fix="set SWITCHBOARD_RUNS_CHANNEL_ID again")
        except PostError as exc:
            await self._failed(ticket, str(exc))
        else:
            self.posted += 1
            self.last_failure = None
            await self._record(ticket.id, "posted", f"in channel {self.channel_id}")

    async def _failed(self, ticket: RunTicket, reason: str) -> None:
        self.last_failure = PostFailure(self._clock(), self.channel_id, reason)
        log.warning("run %s: could not post it in channel %s: %s (the run is kept; /runs show %s has it)",
                    ticket.id, self.channel_id, reason, ticket.id)
        await self._record(ticket.id, "post_failed", f"channel {self.channel_id}: {reason}")

    async def _record(self, run_id: int, kind: str, detail: str) -> None:
        if self.record is None:
            return
        try:
            await self.record(run_id, kind, detail)
        except Exception:  # the post's outcome is a note; losing it must not lose the run
            log.exception("run %s: could not record the post's outcome", run_id)
