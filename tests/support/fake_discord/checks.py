"""What real Discord rejects, with its error bodies: message/embed limits, thread bodies, command
definitions; and who a message would ping.

Error shape (what discord.py's `HTTPException` parses): `{"code", "message", "errors"}` where
`errors` nests by JSON path down to `{"_errors": [{"code", "message"}]}`.
"""

from __future__ import annotations

import math
import re
from typing import Any

Path = tuple[str | int, ...]

CONTENT_MAX = 2000
EMBEDS_MAX = 10
EMBED_TOTAL_MAX = 6000
EMBED_LIMITS = {"title": 256, "description": 4096}
FIELDS_MAX, FIELD_NAME_MAX, FIELD_VALUE_MAX = 25, 256, 1024
FOOTER_MAX, AUTHOR_MAX = 2048, 256
# Flags a bot may set when creating a message: suppress embeds, ephemeral (interactions only),
# suppress notifications, components v2.
CREATE_FLAGS = (1 << 2) | (1 << 6) | (1 << 12) | (1 << 15)

COMMAND_NAME = re.compile(r"^[-_'\w]{1,32}$")
SUB_COMMAND, SUB_COMMAND_GROUP = 1, 2
OPTION_TYPES = set(range(1, 12))
OPTIONS_MAX, CHOICES_MAX = 25, 25


class DiscordError(Exception):
    """An HTTP error exactly as Discord would answer it."""

    headers: dict[str, str] = {}

    def __init__(self, status: int, code: int, message: str, errors: dict | None = None) -> None:
        super().__init__(f"{status} {code} {message} {errors or ''}")
        self.status, self.code, self.message, self.errors = status, code, message, errors

    def body(self) -> dict:
        body: dict[str, Any] = {"message": self.message, "code": self.code}
        if self.errors is not None:
            body["errors"] = self.errors
        return body


class RateLimitError(DiscordError):
    """429 from a shared (per-channel) limit, with the body and headers Discord sends: discord.py retries
    after `retry_after` only when a `Via` header is present (a 429 without it is Cloudflare's ban page)."""

    def __init__(self, retry_after: float, *, limit: int, reset_at: float, bucket: str) -> None:
        super().__init__(429, 20028, "The channel you are writing has hit the write rate limit")
        self.retry_after = round(retry_after, 3)
        self.headers = {"Retry-After": str(max(1, math.ceil(retry_after))), "X-RateLimit-Limit": str(limit),
                        "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": f"{reset_at:.3f}",
                        "X-RateLimit-Reset-After": f"{self.retry_after:.3f}", "X-RateLimit-Bucket": bucket,
                        "X-RateLimit-Scope": "shared", "Via": "1.1 google"}

    def body(self) -> dict:
        return {"message": self.message, "retry_after": self.retry_after, "global": False, "code": self.code}


UNAUTHORIZED = DiscordError(401, 0, "401: Unauthorized")
MISSING_ACCESS = DiscordError(403, 50001, "Missing Access")  # the bot cannot see the channel
MISSING_PERMISSIONS = DiscordError(403, 50013, "Missing Permissions")
NOT_THE_AUTHOR = DiscordError(403, 50005, "Cannot edit a message authored by another user")
WRONG_CHANNEL_TYPE = DiscordError(400, 50024, "Cannot execute action on this channel type")
THREAD_ARCHIVED = DiscordError(400, 50083, "Thread is archived")
UNKNOWN_CHANNEL = DiscordError(404, 10003, "Unknown Channel")
UNKNOWN_GUILD = DiscordError(404, 10004, "Unknown Guild")
UNKNOWN_WEBHOOK = DiscordError(404, 10015, "Unknown Webhook")
UNKNOWN_MESSAGE = DiscordError(404, 10008, "Unknown Message")
# A reply (`message_reference`) to a message that is not in the channel posted to, with
# `fail_if_not_exists` true or left out (Discord's default).
REFERENCE_UNKNOWN = DiscordError(400, 50035, "Invalid Form Body", {"message_reference": {"_errors": [
    {"code": "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "message": "Unknown message"}]}})
UNKNOWN_INTERACTION = DiscordError(404, 10062, "Unknown interaction")
ALREADY_ACKNOWLEDGED = DiscordError(400, 40060, "Interaction has already been acknowledged.")
EMPTY_MESSAGE = DiscordError(400, 50006, "Cannot send an empty message")
INVALID_JSON = DiscordError(400, 50109, "The request body contains invalid JSON.")
NOT_FOUND = DiscordError(404, 0, "404: Not Found")


class _Form:
    """Collects field errors; `raise_if_any` raises 50035 Invalid Form Body with all of them."""

    def __init__(self) -> None:
        self.errors: dict = {}

    def add(self, path: Path, code: str, message: str) -> None:
        node = self.errors
        for key in path:
            node = node.setdefault(str(key), {})
        node.setdefault("_errors", []).append({"code": code, "message": message})

    def max_length(self, path: Path, value: Any, limit: int) -> None:
        if isinstance(value, str) and len(value) > limit:
            self.add(path, "BASE_TYPE_MAX_LENGTH", f"Must be {limit} or fewer in length.")

    def raise_if_any(self) -> None:
        if self.errors:
            raise DiscordError(400, 50035, "Invalid Form Body", self.errors)


def check_message(body: Any, *, at: Path = (), ephemeral_allowed: bool = False, edit: bool = False) -> None:
    """Raise `DiscordError` for a message create/edit body Discord would refuse."""
    if not isinstance(body, dict):
        raise DiscordError(400, 50035, "Invalid Form Body",
                           _single(at, "DICT_TYPE_CONVERT", "Only dictionaries may be used in a DictType"))
    form = _Form()
    content, embeds = body.get("content"), body.get("embeds")
    if content is not None and not isinstance(content, str):
        form.add((*at, "content"), "BASE_TYPE_STRING", "Must be a string.")
    form.max_length((*at, "content"), content, CONTENT_MAX)
    if embeds is not None:
        _check_embeds(form, (*at, "embeds"), embeds)
    flags = body.get("flags") or 0
    allowed = CREATE_FLAGS if ephemeral_allowed else CREATE_FLAGS & ~(1 << 6)
    if not isinstance(flags, int) or flags & ~allowed:
        form.add((*at, "flags"), "MESSAGE_FLAGS_INVALID", "Invalid flags")
    if body.get("allowed_mentions") is not None:
        _check_allowed_mentions(form, (*at, "allowed_mentions"), body["allowed_mentions"])
    form.raise_if_any()
    if not edit and not (content or embeds or body.get("components") or body.get("attachments")
                         or body.get("sticker_ids") or body.get("poll")):
        raise EMPTY_MESSAGE


THREAD_NAME_MAX = 100
THREAD_ARCHIVE_MINUTES = (60, 1440, 4320, 10080)
SLOWMODE_MAX = 21600


def check_thread(body: Any) -> None:
    """Raise `DiscordError` for a start-thread-without-message body Discord would refuse: `name` 1-100
    characters, `type` 10/11/12, `auto_archive_duration` one of 60/1440/4320/10080 (optional),
    `invitable` a boolean, `rate_limit_per_user` 0-21600 or null."""
    if not isinstance(body, dict):
        raise DiscordError(400, 50035, "Invalid Form Body",
                           _single((), "DICT_TYPE_CONVERT", "Only dictionaries may be used in a DictType"))
    form = _Form()
    name = body.get("name")
    if name is None:
        form.add(("name",), "BASE_TYPE_REQUIRED", "This field is required")
    elif not isinstance(name, str) or not 1 <= len(name.strip()) <= THREAD_NAME_MAX:
        form.add(("name",), "BASE_TYPE_BAD_LENGTH", f"Must be between 1 and {THREAD_NAME_MAX} in length.")
    if body.get("type") not in (10, 11, 12):
        form.add(("type",), "BASE_TYPE_CHOICES", "Value must be one of {10, 11, 12}.")
    archive = body.get("auto_archive_duration")
    if archive is not None and (isinstance(archive, bool) or archive not in THREAD_ARCHIVE_MINUTES):
        form.add(("auto_archive_duration",), "BASE_TYPE_CHOICES",
                 f"Value must be one of {set(THREAD_ARCHIVE_MINUTES)}.")
    invitable = body.get("invitable")
    if invitable is not None and not isinstance(invitable, bool):
        form.add(("invitable",), "BASE_TYPE_BOOLEAN", "Must be either true or false.")
    slowmode = body.get("rate_limit_per_user")
    if slowmode is not None and (isinstance(slowmode, bool) or not isinstance(slowmode, int)
                                 or not 0 <= slowmode <= SLOWMODE_MAX):
        form.add(("rate_limit_per_user",), "NUMBER_TYPE_MAX", f"int value should be <= {SLOWMODE_MAX} and >= 0.")
    form.raise_if_any()


MENTION_KINDS = ("roles", "users", "everyone")
MENTION_IDS_MAX = 100
# What Discord parses as a mention in message content; a backslash before it shows it as text.
_MENTION = re.compile(r"(?<!\\)(?:@(everyone|here)|<@!?(\d+)>|<@&(\d+)>)")


def pinged(content: Any, allowed_mentions: dict | None) -> dict:
    """Who a message with this content would mention, as Discord resolves it: `@everyone`/`@here`,
    `<@id>`/`<@!id>` users and `<@&id>` roles, filtered by `allowed_mentions` (absent: all of them).
    Returns `{"everyone": bool, "users": [ids], "roles": [ids]}`, empty lists and False when nobody."""
    found: dict[str, Any] = {"everyone": False, "users": [], "roles": []}
    for everyone, user, role in _MENTION.findall(content if isinstance(content, str) else ""):
        if everyone:
            found["everyone"] = True
        elif user:
            found["users"].append(user)
        else:
            found["roles"].append(role)
    if allowed_mentions is None:
        return found
    parse = allowed_mentions.get("parse") or []
    found["everyone"] = found["everyone"] and "everyone" in parse
    for kind in ("users", "roles"):
        if kind not in parse:
            listed = {str(i) for i in allowed_mentions.get(kind) or []}
            found[kind] = [i for i in found[kind] if i in listed]
    return found


def _check_allowed_mentions(form: _Form, at: Path, mentions: Any) -> None:
    """Discord's allowed-mentions object: `parse` ⊆ roles/users/everyone, `users`/`roles` at most 100
    snowflakes each and exclusive with the same kind in `parse`, `replied_user` a boolean."""
    if not isinstance(mentions, dict):
        form.add(at, "DICT_TYPE_CONVERT", "Only dictionaries may be used in a DictType")
        return
    parse = mentions.get("parse")
    if parse is not None:
        if not isinstance(parse, list):
            form.add((*at, "parse"), "BASE_TYPE_LIST", "Must be a list.")
            parse = []
        for i, kind in enumerate(parse):
            if kind not in MENTION_KINDS:
                form.add((*at, "parse", i), "BASE_TYPE_CHOICES", f"Value must be one of {MENTION_KINDS}.")
    for kind in ("users", "roles"):
        ids = mentions.get(kind)
        if ids is None:
            continue
        if not isinstance(ids, list):
            form.add((*at, kind), "BASE_TYPE_LIST", "Must be a list.")
            continue
        if len(ids) > MENTION_IDS_MAX:
            form.add((*at, kind), "BASE_TYPE_MAX_LENGTH", f"Must be {MENTION_IDS_MAX} or fewer in length.")
        for i, value in enumerate(ids):
            if not str(value).isdigit():
                form.add((*at, kind, i), "NUMBER_TYPE_COERCE", "Value is not snowflake.")
        if kind in (parse or []):
            form.add(at, "MESSAGE_ALLOWED_MENTIONS_PARSE_EXCLUSIVE",
                     f'parse:["{kind}"] and {kind}: [ids...] are mutually exclusive.')
    replied = mentions.get("replied_user")
    if replied is not None and not isinstance(replied, bool):
        form.add((*at, "replied_user"), "BASE_TYPE_BOOLEAN", "Must be either true or false.")


def check_choices(data: Any, focused: dict) -> None:
    """Raise `DiscordError` for an autocomplete result Discord would refuse: at most 25 choices, names
    1-100 characters, values of the focused option's type (strings 1-100 characters)."""
    form = _Form()
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list):
        form.add(("data", "choices"), "BASE_TYPE_REQUIRED", "This field is required")
    elif len(choices) > CHOICES_MAX:
        form.add(("data", "choices"), "BASE_TYPE_MAX_LENGTH", f"Must be {CHOICES_MAX} or fewer in length.")
    else:
        kind = focused.get("type")
        for i, choice in enumerate(choices):
            name, value = choice.get("name"), choice.get("value")
            if not (isinstance(name, str) and 1 <= len(name) <= 100):
                form.add(("data", "choices", i, "name"), "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")
            if kind == 3 and not (isinstance(value, str) and 1 <= len(value) <= 100):
                form.add(("data", "choices", i, "value"), "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")
            elif kind in (4, 10) and (isinstance(value, bool) or not isinstance(value, int | float)):
                form.add(("data", "choices", i, "value"), "NUMBER_TYPE_COERCE", "Value is not a number.")
    form.raise_if_any()


def _check_embeds(form: _Form, at: Path, embeds: Any) -> None:
    if not isinstance(embeds, list):
        form.add(at, "BASE_TYPE_LIST", "Must be a list.")
        return
    if len(embeds) > EMBEDS_MAX:
        form.add(at, "BASE_TYPE_MAX_LENGTH", f"Must be {EMBEDS_MAX} or fewer in length.")
    total = 0
    for i, embed in enumerate(embeds):
        for key, limit in EMBED_LIMITS.items():
            form.max_length((*at, i, key), embed.get(key), limit)
        fields = embed.get("fields") or []
        if len(fields) > FIELDS_MAX:
            form.add((*at, i, "fields"), "BASE_TYPE_MAX_LENGTH", f"Must be {FIELDS_MAX} or fewer in length.")
        for j, fld in enumerate(fields):
            for key, limit in (("name", FIELD_NAME_MAX), ("value", FIELD_VALUE_MAX)):
                if not fld.get(key):
                    form.add((*at, i, "fields", j, key), "BASE_TYPE_REQUIRED", "This field is required")
                form.max_length((*at, i, "fields", j, key), fld.get(key), limit)
        footer, author = embed.get("footer") or {}, embed.get("author") or {}
        form.max_length((*at, i, "footer", "text"), footer.get("text"), FOOTER_MAX)
        form.max_length((*at, i, "author", "name"), author.get("name"), AUTHOR_MAX)
        color = embed.get("color")
        if color is not None and not (isinstance(color, int) and 0 <= color <= 0xFFFFFF):
            form.add((*at, i, "color"), "NUMBER_TYPE_MAX", "int value should be less than or equal to 16777215.")
        texts = [embed.get("title"), embed.get("description"), footer.get("text"), author.get("name"),
                 *(f.get("name") for f in fields), *(f.get("value") for f in fields)]
        total += sum(len(t) for t in texts if isinstance(t, str))
    if total > EMBED_TOTAL_MAX:
        form.add(at, "MAX_EMBED_SIZE_EXCEEDED", f"Embed size exceeds maximum size of {EMBED_TOTAL_MAX}")


def _single(at: Path, code: str, message: str) -> dict:
    form = _Form()
    form.add(at or ("_",), code, message)
    return form.errors


def check_commands(commands: Any) -> None:
    """Raise `DiscordError` for a bulk-overwrite body Discord would refuse (names, nesting, limits)."""
    if not isinstance(commands, list):
        raise DiscordError(400, 50035, "Invalid Form Body", _single((), "BASE_TYPE_LIST", "Must be a list."))
    form = _Form()
    seen: set[tuple[str, int]] = set()
    for i, command in enumerate(commands):
        kind = command.get("type", 1)
        name = command.get("name")
        if (name, kind) in seen:
            form.add((i, "name"), "APPLICATION_COMMANDS_DUPLICATE_NAME", f"Application command names must be unique: {name}")
        seen.add((name, kind))
        if kind == 1:
            _check_chat_input(form, (i,), command, depth=0)
        elif command.get("options") or command.get("description"):
            form.add((i,), "APPLICATION_COMMAND_INVALID", "Context menu commands take no options or description")
    form.raise_if_any()


def _check_chat_input(form: _Form, at: Path, node: dict, *, depth: int) -> None:
    name, description = node.get("name"), node.get("description")
    if not (isinstance(name, str) and COMMAND_NAME.match(name) and name == name.lower()):
        form.add((*at, "name"), "APPLICATION_COMMAND_INVALID_NAME", f"Command name is invalid: {name!r}")
    if not (isinstance(description, str) and 1 <= len(description) <= 100):
        form.add((*at, "description"), "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")
    options = node.get("options") or []
    if len(options) > OPTIONS_MAX:
        form.add((*at, "options"), "BASE_TYPE_MAX_LENGTH", f"Must be {OPTIONS_MAX} or fewer in length.")
    kinds = [o.get("type") for o in options]
    subs = [k in (SUB_COMMAND, SUB_COMMAND_GROUP) for k in kinds]
    if any(subs) and not all(subs):
        form.add((*at, "options"), "APPLICATION_COMMAND_OPTIONS_TYPE_INVALID",
                 "Sub-command and sub-command group option types are mutually exclusive to all other types")
    names = [o.get("name") for o in options]
    if len(set(names)) != len(names):
        form.add((*at, "options"), "APPLICATION_COMMAND_OPTIONS_DUPLICATE_NAME", "Option names must be unique")
    seen_optional = False
    for j, option in enumerate(options):
        where, kind = (*at, "options", j), option.get("type")
        if kind not in OPTION_TYPES:
            form.add((*where, "type"), "BASE_TYPE_CHOICES", f"Value must be one of {sorted(OPTION_TYPES)}.")
        elif kind == SUB_COMMAND_GROUP and depth > 0 or kind == SUB_COMMAND and depth > 1:
            form.add((*where, "type"), "APPLICATION_COMMAND_OPTIONS_TYPE_INVALID", "Sub-commands nest at most group > command")
        elif kind == SUB_COMMAND_GROUP and any(o.get("type") != SUB_COMMAND for o in option.get("options") or []):
            form.add((*where, "options"), "APPLICATION_COMMAND_OPTIONS_TYPE_INVALID", "Groups contain only sub-commands")
        if kind in (SUB_COMMAND, SUB_COMMAND_GROUP):
            _check_chat_input(form, where, option, depth=depth + 1)
            continue
        _check_chat_input(form, where, {**option, "options": None}, depth=depth + 1)
        if option.get("required"):
            if seen_optional:
                form.add((*where, "required"), "APPLICATION_COMMAND_OPTIONS_REQUIRED_INVALID",
                         "Required options must be placed before non-required options")
        else:
            seen_optional = True
        if len(option.get("choices") or []) > CHOICES_MAX:
            form.add((*where, "choices"), "BASE_TYPE_MAX_LENGTH", f"Must be {CHOICES_MAX} or fewer in length.")
