"""The bot's application id from its token, and the invite URL with exactly the permissions it needs."""

from __future__ import annotations

import base64
import binascii

# View Channel, Send Messages, Embed Links, Connect, Speak; Create Public Threads and Send Messages in
# Threads for a call's live captions (a thread under the channel `/talk join` was used in); Read
# Message History for results posted as replies under a call card (without it: Discord error 160002).
PERMISSIONS = (1 << 10) | (1 << 11) | (1 << 14) | (1 << 16) | (1 << 20) | (1 << 21) | (1 << 35) | (1 << 38)
SCOPES = "bot%20applications.commands"


def application_id(token: str) -> int | None:
    """A bot token is `base64(user id).timestamp.hmac`; the bot's user id is its application id."""
    parts = token.strip().split(".")
    if len(parts) != 3 or not all(parts):
        return None
    head = parts[0] + "=" * (-len(parts[0]) % 4)
    try:
        decoded = base64.urlsafe_b64decode(head).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return int(decoded) if decoded.isdigit() and 15 <= len(decoded) <= 20 else None


def invite_url(app_id: int) -> str:
    return (f"https://discord.com/oauth2/authorize?client_id={app_id}&scope={SCOPES}"
            f"&permissions={PERMISSIONS}")
