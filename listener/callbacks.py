"""Post-call callbacks: the user's own natural-language instructions, run after each new call.

A callback is user-authorised work (one job per enabled callback per call); the default review is
the callback `default-review`, managed by `transcript_review_config show|set|clear`. Changing any
callback needs an authority decided outside this module (the Discord operator gate, the person at
the terminal) or a short-lived mutation token, which only a named-command job is ever issued
(`MutationTokens`): a callback job or a caller can never rewrite future callbacks.

Deliver targets are validated when saved: `local` (archive and log only), `discord:<channel id>`,
or empty (inherit the default, SWITCHBOARD_TRANSCRIPTS_CHANNEL_ID).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from listener.repository import CallbackRepository, Database, TokenRepository, TranscriptRepository

REVIEW_ID = "default-review"
REVIEW_NAME = "Call review"
MAX_INSTRUCTIONS = 4000
MAX_NAME = 80
TOKEN_TTL_S = 15 * 60
_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
_SNOWFLAKE = re.compile(r"[1-9][0-9]{16,19}")


class CallbackError(ValueError):
    """A callback change that is refused; the message says what to do instead."""


@dataclass(frozen=True)
class Callback:
    id: str
    name: str
    instructions: str
    enabled: bool
    deliver: str  # "" = the default target
    revision: int
    created_at: float
    updated_at: float

    @property
    def is_review(self) -> bool:
        return self.id == REVIEW_ID

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "instructions": self.instructions, "enabled": self.enabled,
                "deliver": self.deliver or "default", "revision": self.revision}


def check_deliver(value: str | None) -> str:
    """The normalised deliver target ("" = default) or CallbackError saying what is accepted."""
    text = _string(value, "deliver")
    if text in ("", "default"):
        return ""
    if text.lower() == "local":
        return "local"
    kind, _, target = text.partition(":")
    if kind.lower() == "discord" and _SNOWFLAKE.fullmatch(target.strip()):
        return f"discord:{target.strip()}"
    if kind.lower() == "discord":
        raise CallbackError(f"{text!r} is not a Discord channel: use discord:<channel id> (the channel's numeric "
                            "ID: Developer Mode, right-click the channel, Copy Channel ID)")
    raise CallbackError(f"deliver target {text!r} is not one Switchboard knows: use local (archive only), "
                        "discord:<channel id>, or leave it out for the default channel")


def deliver_channel(deliver: str, default_channel: int | None) -> int | None:
    """The Discord channel a job's result goes to (None: archive and log only)."""
    if deliver == "local":
        return None
    if deliver.startswith("discord:"):
        return int(deliver.split(":", 1)[1])
    return default_channel


def _string(value: object, what: str) -> str:
    if value is not None and not isinstance(value, str):
        raise CallbackError(f"{what} must be text, not {type(value).__name__}")
    return (value or "").strip()


def check_id(value: str | None) -> str:
    text = _string(value, "the callback id").lower()
    if not _ID.fullmatch(text):
        raise CallbackError(f"callback id {value!r} is not valid: use 1-40 lowercase letters, digits, - or _ "
                            "(e.g. calendar-events)")
    return text


def _text(value: str | None, what: str, limit: int) -> str:
    text = _string(value, what)
    if not text:
        raise CallbackError(f"the callback needs {what}")
    if len(text) > limit:
        raise CallbackError(f"the {what} is {len(text)} characters; keep it under {limit}")
    return text


def _row(row: Any) -> Callback:
    return Callback(row["id"], row["name"], row["instructions"], bool(row["enabled"]), row["deliver"],
                    int(row["revision"]), float(row["created_at"]), float(row["updated_at"]))


class Callbacks:
    """The callbacks table. Every change bumps the revision; a removed callback's history stays in the
    execution ledger (its jobs are not forgotten)."""

    def __init__(self, db: Database, *, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self._rows = CallbackRepository(db)
        self._transcripts = TranscriptRepository(db)
        self._clock = clock

    async def list(self, *, include_review: bool = True) -> list[Callback]:
        rows = await self._rows.all(first=REVIEW_ID)
        return [_row(r) for r in rows if include_review or r["id"] != REVIEW_ID]

    async def get(self, callback_id: str) -> Callback:
        row = await self._rows.get(check_id(callback_id))
        if row is None:
            raise CallbackError(f"there is no callback {callback_id!r}; `list` shows them")
        return _row(row)

    async def register(self, callback_id: str, name: str, instructions: str, deliver: str | None = None) -> Callback:
        cid = check_id(callback_id)
        if cid == REVIEW_ID:
            raise CallbackError("default-review is the call review: change it with transcript_review_config set")
        values = (cid, _text(name, "a name", MAX_NAME), _text(instructions, "instructions", MAX_INSTRUCTIONS),
                  check_deliver(deliver))
        if not await self._rows.insert_new(*values, self._clock()):
            raise CallbackError(f"a callback {cid!r} exists already: update it, or pick another id")
        return await self.get(cid)

    async def update(self, callback_id: str, *, name: str | None = None, instructions: str | None = None,
                     deliver: str | None = None) -> Callback:
        """Change what is given; `deliver=""` clears an override back to the default."""
        current = await self.get(callback_id)
        if current.is_review:
            raise CallbackError("default-review is the call review: change it with transcript_review_config set")
        new_name = current.name if name is None else _text(name, "a name", MAX_NAME)
        new_text = current.instructions if instructions is None else _text(instructions, "instructions",
                                                                           MAX_INSTRUCTIONS)
        new_deliver = None if deliver is None else check_deliver(deliver)
        await self._write(current.id, name=None if name is None else new_name,
                          instructions=None if instructions is None else new_text, deliver=new_deliver)
        return await self.get(current.id)

    async def set_enabled(self, callback_id: str, enabled: bool) -> Callback:
        current = await self.get(callback_id)
        await self._write(current.id, enabled=enabled)
        return await self.get(current.id)

    async def remove(self, callback_id: str) -> Callback:
        current = await self.get(callback_id)
        await self._delete(current.id)
        return current

    async def _delete(self, callback_id: str) -> None:
        await self._rows.delete(callback_id)

    async def _write(self, cid: str, *, name: str | None = None, instructions: str | None = None,
                     deliver: str | None = None, enabled: bool | None = None) -> None:
        """Change only the fields given, in one statement: another process changing another field of the
        same callback at the same moment keeps its change (no read-modify-write)."""
        await self._rows.change(cid, name=name, instructions=instructions, deliver=deliver, enabled=enabled,
                                now=self._clock())

    # -- the default review ------------------------------------------------------------------------

    async def review(self) -> Callback | None:
        row = await self._rows.get(REVIEW_ID)
        return None if row is None else _row(row)

    async def set_review(self, instructions: str, deliver: str | None = None) -> Callback:
        text = _text(instructions, "review instructions", MAX_INSTRUCTIONS)
        target = check_deliver(deliver)
        # one statement: two processes setting it at once both succeed
        await self._rows.put(REVIEW_ID, REVIEW_NAME, text, target, self._clock(), replace_deliver=deliver is not None)
        review = await self.review()
        assert review is not None
        return review

    async def clear_review(self) -> bool:
        current = await self.review()
        if current is not None:
            await self._delete(REVIEW_ID)
        return current is not None

    async def due(self, *, auto_review: bool, received_at: float) -> list[Callback]:
        """What runs after a call that arrived at `received_at`: the review first (when it has
        instructions and auto review is on), then every enabled callback that existed before then — a
        callback registered later (or at the same instant: its order is unknown) never fires for that
        call. Prefer `due_for_call`, which reads the arrival time from the archive itself."""
        return [c for c in await self.list() if c.enabled and (auto_review or not c.is_review)
                and c.created_at < received_at]

    async def due_for_call(self, transcript_id: int, *, auto_review: bool) -> list[Callback]:
        """`due` for an archived call, measured against the time it was first archived — never the time
        of this delivery, so a redelivered event cannot run a callback registered after the call.
        Nothing is due for a call that is not archived."""
        received_at = await self._transcripts.received_at(transcript_id)
        if received_at is None:
            return []
        return await self.due(auto_review=auto_review, received_at=received_at)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class MutationTokens:
    """Short-lived tokens that let one named-command job change callbacks. Only hashes are stored;
    a token is revoked when its job lands, and expires after `ttl_s` regardless."""

    def __init__(self, db: Database, *, clock: Callable[[], float] = time.time, ttl_s: float = TOKEN_TTL_S) -> None:
        self.db = db
        self._rows = TokenRepository(db)
        self._clock = clock
        self.ttl_s = ttl_s

    async def issue(self, job_key: str) -> str:
        token = "sbt_" + secrets.token_urlsafe(24)
        now = self._clock()
        await self._rows.add(_digest(token), job_key, expires_at=now + self.ttl_s, now=now)
        return token

    async def valid(self, token: str | None) -> bool:
        """True only for an issued, unexpired, unrevoked token (fail-closed on anything else)."""
        if not token or not isinstance(token, str) or not token.startswith("sbt_") or len(token) > 100:
            return False
        digest = _digest(token.strip())
        row = await self._rows.get(digest)
        return row is not None and hmac.compare_digest(row["token_hash"], digest) and \
            float(row["expires_at"]) > self._clock()

    async def revoke(self, job_key: str) -> None:
        await self._rows.revoke(job_key)
