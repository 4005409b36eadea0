"""Every message the bot posts in a channel goes through `send`: nobody is ever pinged (allowed
mentions: none), and a post Discord refuses becomes one `PostError` line that says what to fix.

Callers decide what a failed post means: a run's post is kept for `/talk status` and `doctor`
(`runs_channel`), a call card is retried with the next delivery (`phone_cards`), a note in a call's
text channel is logged (`calls`). Live captions post and edit in their own thread (`captions`), with
the same no-pings rule (`NO_PINGS`).
"""

from __future__ import annotations

import discord

NO_PINGS = discord.AllowedMentions.none()
PERMISSIONS = "View Channel, Send Messages and Embed Links"


class PostError(RuntimeError):
    """A post Discord refused; the message says what to fix."""


def post_problem(exc: BaseException, channel_id: int, fix: str = "") -> str:
    """Why a post in `channel_id` failed, in one line; `fix` is added where the channel is missing."""
    if isinstance(exc, discord.Forbidden):
        return f"the bot may not post in channel {channel_id} (it needs {PERMISSIONS})"
    if isinstance(exc, discord.NotFound):
        return f"channel {channel_id} does not exist (deleted?)" + (f"; {fix}" if fix else "")
    return f"Discord refused the post in channel {channel_id} ({type(exc).__name__}: {str(exc)[:200]})"


async def send(client: discord.Client, channel_id: int, *, fix: str = "", **kwargs) -> discord.Message:
    """Post `kwargs` (content, embed, reference, …) in `channel_id`. Raises PostError."""
    channel = client.get_partial_messageable(channel_id)
    try:
        return await channel.send(allowed_mentions=NO_PINGS, **kwargs)
    except (discord.HTTPException, OSError) as exc:
        raise PostError(post_problem(exc, channel_id, fix)) from None
