"""INTERACTION_CREATE payloads for slash commands, built only for commands the bot has synced.

Like Discord's client, the builder refuses what a user could not send: an unregistered command, a
group invoked without a sub-command, unknown or missing required options, wrong value types,
values outside the declared choices or bounds. An autocomplete interaction (`focused=`) carries
the options typed so far, the focused one as the partial text, and only for an option declared
with autocomplete.
"""

from __future__ import annotations

from typing import Any

from tests.support.fake_discord.objects import BOT_PERMISSIONS, Channel, SimUser
from tests.support.fake_discord.state import DiscordState, PendingInteraction

SUB_COMMAND, SUB_COMMAND_GROUP = 1, 2
STRING, INTEGER, BOOLEAN, USER, CHANNEL, ROLE, MENTIONABLE, NUMBER, ATTACHMENT = 3, 4, 5, 6, 7, 8, 9, 10, 11
APPLICATION_COMMAND, APPLICATION_COMMAND_AUTOCOMPLETE = 2, 4


class NotInvocable(LookupError):
    """The interaction a test asked for could not come from a real Discord client."""


def build_command_interaction(state: DiscordState, command: str, options: dict[str, Any] | None,
                              user: SimUser, channel: Channel, *, focused: str | None = None) -> PendingInteraction:
    """`command` is the typed path, e.g. "talk status" or "talk admin reset"; `focused` names the option
    being typed for an autocomplete interaction."""
    path = command.split()
    guild = state.guild_of_channel(channel.id)
    registered = _find_command(state, path[0], guild.id)
    node, chain = registered, []
    for name in path[1:]:
        node = next((o for o in node.get("options") or []
                     if o["type"] in (SUB_COMMAND, SUB_COMMAND_GROUP) and o["name"] == name), None)
        if node is None:
            raise NotInvocable(f"/{command}: no sub-command {name!r} registered")
        chain.append(node)
    if any(o["type"] in (SUB_COMMAND, SUB_COMMAND_GROUP) for o in node.get("options") or []):
        raise NotInvocable(f"/{command} is a group; Discord clients can only invoke its sub-commands")
    resolved: dict[str, dict] = {}
    values = _options(state, command, node, options or {}, resolved, focused)
    for parent in reversed(chain):
        values = [{"type": parent["type"], "name": parent["name"], "options": values}]
    data: dict[str, Any] = {"id": registered["id"], "name": registered["name"], "type": 1, "options": values}
    if "guild_id" in registered:
        data["guild_id"] = registered["guild_id"]
    if resolved:
        data["resolved"] = resolved
    interaction_id, token = state.ids(), state.new_token("aW50ZXJhY3Rpb24")
    payload = {
        "id": str(interaction_id), "application_id": str(state.application_id),
        "type": APPLICATION_COMMAND if focused is None else APPLICATION_COMMAND_AUTOCOMPLETE,
        "data": data, "guild_id": str(guild.id), "guild": {"id": str(guild.id), "locale": "en-US", "features": []},
        "channel_id": str(channel.id), "channel": {**channel.payload(), "permissions": str(user.permissions)},
        "member": user.member_payload(guild, with_permissions=True), "token": token, "version": 1,
        "app_permissions": str(BOT_PERMISSIONS), "locale": "en-US", "guild_locale": "en-US",
        "entitlements": [], "authorizing_integration_owners": {"0": str(guild.id)}, "context": 0,
        "attachment_size_limit": 10_485_760,
    }
    pending = PendingInteraction(interaction_id, token, user, channel.id, payload)
    state.interactions[interaction_id] = pending
    return pending


def _find_command(state: DiscordState, name: str, guild_id: int) -> dict:
    for command in (*state.commands_for(guild_id), *state.commands_for(None)):
        if command["name"] == name and command["type"] == 1:
            return command
    synced = sorted({c["name"] for c in (*state.global_commands, *state.commands_for(guild_id))})
    raise NotInvocable(f"/{name} is not registered with Discord (synced: {synced})")


def _options(state: DiscordState, command: str, node: dict, given: dict[str, Any],
             resolved: dict[str, dict], focused: str | None = None) -> list[dict]:
    declared = {o["name"]: o for o in node.get("options") or []}
    unknown = set(given) - set(declared)
    if unknown:
        raise NotInvocable(f"/{command}: unknown options {sorted(unknown)}")
    if focused is not None:  # while typing, required options may still be empty
        if focused not in given or not declared[focused].get("autocomplete"):
            raise NotInvocable(f"/{command} {focused}: not an option with autocomplete being typed")
    else:
        missing = [n for n, o in declared.items() if o.get("required") and n not in given]
        if missing:
            raise NotInvocable(f"/{command}: missing required options {missing}")
    values = []
    for name, value in given.items():
        option = declared[name]
        if name == focused:  # the partial text as typed, not yet a valid value
            if not isinstance(value, str):
                raise NotInvocable(f"/{command} {name}: the text being typed is a string")
            values.append({"type": option["type"], "name": name, "value": value, "focused": True})
            continue
        values.append({"type": option["type"], "name": name,
                       "value": _value(state, command, option, value, resolved)})
    return values


def _value(state: DiscordState, command: str, option: dict, value: Any, resolved: dict[str, dict]) -> Any:
    kind, name = option["type"], option["name"]

    def bad(why: str) -> NotInvocable:
        return NotInvocable(f"/{command} {name}: {why}")

    if kind == STRING:
        if not isinstance(value, str):
            raise bad("expects a string")
        if not option.get("min_length", 0) <= len(value) <= option.get("max_length", 6000):
            raise bad("length out of bounds")
    elif kind in (INTEGER, NUMBER):
        if isinstance(value, bool) or not isinstance(value, int if kind == INTEGER else (int, float)):
            raise bad("expects an integer" if kind == INTEGER else "expects a number")
        low, high = option.get("min_value"), option.get("max_value")
        if (low is not None and value < low) or (high is not None and value > high):
            raise bad("value out of bounds")
    elif kind == BOOLEAN:
        if not isinstance(value, bool):
            raise bad("expects a boolean")
    elif kind == USER:
        user = state.guild.members.get(value.id if isinstance(value, SimUser) else int(value))
        if user is None:
            raise bad("unknown user")
        resolved.setdefault("users", {})[str(user.id)] = user.user_payload()
        member = user.member_payload(state.guild, with_permissions=True)
        member.pop("user")
        resolved.setdefault("members", {})[str(user.id)] = member
        return str(user.id)
    elif kind == CHANNEL:
        channel = state.guild.channel(value.id if isinstance(value, Channel) else int(value))
        if channel is None:
            raise bad("unknown channel")
        types = option.get("channel_types")
        if types and channel.type not in types:
            raise bad(f"channel type {channel.type} not allowed")
        resolved.setdefault("channels", {})[str(channel.id)] = {
            "id": str(channel.id), "name": channel.name, "type": channel.type,
            "permissions": str(BOT_PERMISSIONS), "parent_id": None, "nsfw": False, "flags": 0,
            "position": channel.position, "rate_limit_per_user": 0, "last_message_id": None}
        return str(channel.id)
    else:
        raise bad(f"option type {kind} is not supported by the fake")
    choices = option.get("choices")
    if choices and value not in [c["value"] for c in choices]:
        raise bad(f"{value!r} is not one of the declared choices")
    return value
