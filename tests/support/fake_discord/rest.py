"""The REST half of the fake (`/api/v10/...`): login, command sync, interaction responses, messages
(create and edit, in channels and threads), threads.

Every request is recorded in the journal with the status the fake answered. Bot routes need
`Authorization: Bot <token>` (401 otherwise, which discord.py turns into `LoginFailure` at login);
interaction callbacks and webhooks carry no Authorization, as discord.py sends them. Bodies are
checked by `checks.py`; errors use Discord's codes and shapes. Responses are `application/json`
exactly (discord.py only parses that). Channel routes check the bot's permissions from the channel's
overwrites (`FakeDiscord.deny_bot`; a thread's are its parent's), and message creates and edits share
each channel's write limit (429 with Discord's rate-limit body and headers).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tests.support.fake_discord.checks import (
    ALREADY_ACKNOWLEDGED,
    EMPTY_MESSAGE,
    INVALID_JSON,
    MISSING_ACCESS,
    MISSING_PERMISSIONS,
    NOT_FOUND,
    NOT_THE_AUTHOR,
    REFERENCE_UNKNOWN,
    THREAD_ARCHIVED,
    UNAUTHORIZED,
    UNKNOWN_CHANNEL,
    UNKNOWN_GUILD,
    UNKNOWN_INTERACTION,
    UNKNOWN_MESSAGE,
    UNKNOWN_WEBHOOK,
    WRONG_CHANNEL_TYPE,
    DiscordError,
    check_choices,
    check_commands,
    check_message,
    check_thread,
    pinged,
)
from tests.support.fake_discord.journal import RestCall
from tests.support.fake_discord.objects import (
    CREATE_PRIVATE_THREADS,
    CREATE_PUBLIC_THREADS,
    EPHEMERAL,
    LOADING,
    PUBLIC_THREAD,
    SEND_MESSAGES,
    SEND_MESSAGES_IN_THREADS,
    TEXT,
    VIEW_CHANNEL,
    Channel,
    ThreadChannel,
    iso_now,
    message_payload,
)
from tests.support.fake_discord.state import DiscordState, PendingInteraction

API_PREFIX = "/api/v10"
# Interaction callback types allowed for an APPLICATION_COMMAND interaction; an
# APPLICATION_COMMAND_AUTOCOMPLETE interaction allows only AUTOCOMPLETE_RESULT.
MESSAGE, DEFERRED, MODAL, AUTOCOMPLETE_RESULT = 4, 5, 9, 8
AUTOCOMPLETE_INTERACTION = 4
CHAT_INPUT_COMMAND_MESSAGE = 20  # message type of an interaction's response
BODY = web.RequestKey("body", object)  # the parsed JSON body, set by the middleware
SUPPRESS_EMBEDS = 1 << 2
DEFAULT_ARCHIVE_MINUTES = 1440  # a text channel's default_auto_archive_duration


def json_response(status: int, data: Any) -> web.Response:
    return web.Response(status=status, body=json.dumps(data).encode(),
                        headers={"Content-Type": "application/json"})


class RestApi:
    """aiohttp routes over a `DiscordState`; mount with `app.add_subapp(API_PREFIX, api.app)`."""

    def __init__(self, state: DiscordState, *,
                 on_thread_created: Callable[[ThreadChannel], Awaitable[None]] | None = None) -> None:
        self.state = state
        self._on_thread_created = on_thread_created  # the server tells the gateway (THREAD_CREATE)
        self.app = web.Application(middlewares=[self._middleware])
        bot, hook = self._bot, self._webhook
        r = self.app.router
        r.add_get("/users/@me", bot(self.get_me))
        r.add_get("/oauth2/applications/@me", bot(self.get_application))
        r.add_route("*", "/applications/{app}/commands", bot(self.commands))
        r.add_route("*", "/applications/{app}/guilds/{guild}/commands", bot(self.commands))
        r.add_get("/channels/{channel}", bot(self.get_channel))
        r.add_post("/channels/{channel}/messages", bot(self.create_message))
        r.add_patch("/channels/{channel}/messages/{message}", bot(self.edit_message))
        r.add_post("/channels/{channel}/threads", bot(self.create_thread))
        r.add_post("/interactions/{interaction}/{token}/callback", hook(self.interaction_callback))
        r.add_post("/webhooks/{app}/{token}", hook(self.followup))
        r.add_route("*", "/webhooks/{app}/{token}/messages/{message}", hook(self.webhook_message))

    # -- plumbing ---------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        raw = await request.read()
        call = RestCall(request.method, request.path, dict(request.query), dict(request.headers), None,
                        at=self.state.clock())
        self.state.journal.rest.append(call)
        try:
            if raw:
                if request.headers.get("Content-Type") != "application/json":
                    raise DiscordError(400, 50035, "Invalid Form Body", {"_errors": [
                        {"code": "CONTENT_TYPE_INVALID", "message": "Expected application/json"}]})
                try:
                    call.body = json.loads(raw)
                except ValueError:
                    raise INVALID_JSON from None
            request[BODY] = call.body
            response = await handler(request)
        except web.HTTPNotFound:
            self.state.journal.violation(f"unknown route {request.method} {request.path}")
            response = json_response(NOT_FOUND.status, NOT_FOUND.body())
        except web.HTTPMethodNotAllowed:
            self.state.journal.violation(f"method not allowed {request.method} {request.path}")
            response = json_response(405, {"message": "405: Method Not Allowed", "code": 0})
        except DiscordError as exc:
            response = json_response(exc.status, exc.body())
            response.headers.update(exc.headers)
            call.response_headers = dict(exc.headers)
        call.status = response.status
        call.response = json.loads(response.body) if isinstance(response.body, bytes) and response.body else None
        self.state.journal.changed()
        return response

    def _bot(self, handler: Any) -> Any:
        async def checked(request: web.Request) -> web.StreamResponse:
            if request.headers.get("Authorization") != f"Bot {self.state.token}":
                raise UNAUTHORIZED
            if not request.headers.get("User-Agent", "").startswith("DiscordBot ("):
                self.state.journal.violation(f"bot request without a DiscordBot User-Agent: {request.path}")
            return await handler(request)
        return checked

    def _webhook(self, handler: Any) -> Any:
        return handler  # interaction and webhook-token routes are authorised by their token alone

    @staticmethod
    def _snowflake(request: web.Request, key: str) -> int:
        try:
            return int(request.match_info[key])
        except ValueError:
            raise DiscordError(400, 50035, "Invalid Form Body", {key: {"_errors": [
                {"code": "NUMBER_TYPE_COERCE", "message": "Value is not snowflake."}]}}) from None

    # -- login ------------------------------------------------------------------------------

    async def get_me(self, request: web.Request) -> web.Response:
        me = {**self.state.bot.user_payload(), "verified": True, "mfa_enabled": False, "flags": 0,
              "locale": "en-US", "email": None, "banner": None, "accent_color": None}
        return json_response(200, me)

    async def get_application(self, request: web.Request) -> web.Response:
        s = self.state
        return json_response(200, {
            "id": str(s.application_id), "name": s.bot.username, "icon": None, "description": "",
            "summary": "", "type": None, "bot_public": False, "bot_require_code_grant": False,
            "verify_key": "0" * 64, "owner": s.owner.user_payload(), "team": None, "flags": 0,
            "bot": s.bot.user_payload(), "interactions_endpoint_url": None, "redirect_uris": [],
            "approximate_guild_count": 1})

    # -- application commands ---------------------------------------------------------------

    async def commands(self, request: web.Request) -> web.Response:
        if self._snowflake(request, "app") != self.state.application_id:
            raise DiscordError(403, 20012, "You are not authorized to perform this action on this application")
        guild_id = self._snowflake(request, "guild") if "guild" in request.match_info else None
        if guild_id is not None and self.state.guild_by_id(guild_id) is None:
            raise UNKNOWN_GUILD
        if request.method == "GET":
            return json_response(200, self.state.commands_for(guild_id))
        if request.method != "PUT":
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "PUT"])
        check_commands(request[BODY])
        return json_response(200, self.state.register_commands(guild_id, request[BODY]))

    # -- channels ---------------------------------------------------------------------------

    def _channel(self, request: web.Request) -> Channel | ThreadChannel:
        """The channel or thread in the path (404 Unknown Channel), or the failure the test set on it."""
        channel_id = self._snowflake(request, "channel")
        if channel_id in self.state.channel_failures:
            raise self.state.channel_failures[channel_id]
        target = self.state.messageable(channel_id)
        if target is None:
            raise UNKNOWN_CHANNEL
        return target

    def _require(self, target: Channel | ThreadChannel, permission: int) -> None:
        """403 unless the bot may see `target` and has `permission` there (a thread's are its parent's)."""
        channel = self.state.guild.channel(target.parent_id) if isinstance(target, ThreadChannel) else target
        allowed = self.state.guild.permissions(self.state.bot, channel)
        if not allowed & VIEW_CHANNEL:
            raise MISSING_ACCESS
        if not allowed & permission:
            raise MISSING_PERMISSIONS

    async def get_channel(self, request: web.Request) -> web.Response:
        return json_response(200, self._channel(request).payload())

    async def create_message(self, request: web.Request) -> web.Response:
        target = self._channel(request)
        thread = target if isinstance(target, ThreadChannel) else None
        self._require(target, SEND_MESSAGES_IN_THREADS if thread else SEND_MESSAGES)
        if thread is not None and thread.locked:
            raise MISSING_PERMISSIONS  # only thread managers post in a locked thread
        check_message(request[BODY])
        body = request[BODY]
        replied_to = self._replied_to(target.id, body.get("message_reference"))
        self.state.take_write(target.id)
        message = message_payload(message_id=self.state.ids(), channel_id=target.id, guild_id=self.state.guild.id,
                                  author=self.state.bot, body=body, flags=body.get("flags") or 0,
                                  replied_to=replied_to, position=thread.total_message_sent if thread else None)
        if thread is not None:  # a post un-archives an unlocked thread
            thread.archived = False
            thread.message_count += 1
            thread.total_message_sent += 1
            thread.last_message_id = int(message["id"])
        self.state.messages.append(message)
        self._note_mentions(message, body)
        return json_response(200, message)

    async def edit_message(self, request: web.Request) -> web.Response:
        """PATCH a message: only the bot's own (403 50005 otherwise), with the same content checks as a
        create; the message must keep some content. Edits share the channel's write limit."""
        target = self._channel(request)
        self._require(target, VIEW_CHANNEL)
        message = self.state.find_message(target.id, self._snowflake(request, "message"))
        if message is None:
            raise UNKNOWN_MESSAGE
        if message["author"]["id"] != str(self.state.bot.id):
            raise NOT_THE_AUTHOR
        body = request[BODY] if request[BODY] is not None else {}
        check_message(body, edit=True)
        content = body["content"] if "content" in body else message["content"]
        embeds = body["embeds"] if "embeds" in body else message["embeds"]
        components = body["components"] if "components" in body else message["components"]
        if not (content or embeds or components or message["attachments"]):
            raise EMPTY_MESSAGE
        if isinstance(target, ThreadChannel) and target.archived:
            raise THREAD_ARCHIVED
        self.state.take_write(target.id)
        message["content"] = content or ""
        message["embeds"] = [{"type": "rich", **e} for e in embeds or []] if "embeds" in body else embeds
        message["components"] = components or []
        if "flags" in body:  # only SUPPRESS_EMBEDS can change on an existing message
            message["flags"] = (message["flags"] & ~SUPPRESS_EMBEDS) | ((body["flags"] or 0) & SUPPRESS_EMBEDS)
        message["edited_timestamp"] = iso_now()
        self.state.message_edits[message["id"]] = self.state.message_edits.get(message["id"], 0) + 1
        self._note_mentions(message, body)
        return json_response(200, message)

    def _note_mentions(self, message: dict, body: dict) -> None:
        found = pinged(message["content"], body.get("allowed_mentions"))
        if found["everyone"] or found["users"] or found["roles"]:
            self.state.pinged.append({"message_id": message["id"], **found})

    async def create_thread(self, request: web.Request) -> web.Response:
        """Start a thread without a message under a text channel: Discord answers 201 with the thread and
        tells the gateway (THREAD_CREATE, `newly_created`)."""
        parent = self._channel(request)
        if isinstance(parent, ThreadChannel) or parent.type != TEXT:
            raise WRONG_CHANNEL_TYPE
        body = request[BODY]
        check_thread(body)
        if body["type"] == 10:  # announcement threads only live in announcement channels
            raise WRONG_CHANNEL_TYPE
        self._require(parent, CREATE_PUBLIC_THREADS if body["type"] == PUBLIC_THREAD else CREATE_PRIVATE_THREADS)
        thread = self.state.new_thread(parent, body["name"], body["type"],
                                       body.get("auto_archive_duration") or DEFAULT_ARCHIVE_MINUTES,
                                       invitable=body.get("invitable", True) is not False,
                                       rate_limit_per_user=body.get("rate_limit_per_user") or 0)
        if self._on_thread_created is not None:
            await self._on_thread_created(thread)
        return json_response(201, thread.payload())

    def _replied_to(self, channel_id: int, reference: Any) -> dict | None:
        """The message a create's `message_reference` replies to, as Discord resolves it: it must be a
        message in the channel posted to; when it is not, 400 MESSAGE_REFERENCE_UNKNOWN_MESSAGE unless
        `fail_if_not_exists` is false, which sends a normal message (the reference is dropped)."""
        if reference is None:
            return None
        if not isinstance(reference, dict):
            raise DiscordError(400, 50035, "Invalid Form Body", {"message_reference": {"_errors": [
                {"code": "DICT_TYPE_CONVERT", "message": "Only dictionaries may be used in a DictType"}]}})
        if reference.get("type", 0) != 0:  # forwards (type 1) are not modelled by the fake
            self.state.journal.violation(f"message_reference type {reference.get('type')!r}: only replies (0) "
                                         "are modelled")
        message_id = reference.get("message_id")
        if message_id is None or not str(message_id).isdigit():
            raise DiscordError(400, 50035, "Invalid Form Body", {"message_reference": {"message_id": {"_errors": [
                {"code": "BASE_TYPE_REQUIRED" if message_id is None else "NUMBER_TYPE_COERCE",
                 "message": "This field is required" if message_id is None else "Value is not snowflake."}]}}})
        for key, expected in (("channel_id", channel_id), ("guild_id", self.state.guild.id)):
            if reference.get(key) is not None and str(reference[key]) != str(expected):
                # A reply must be in the referenced message's channel; it is never silently moved.
                self.state.journal.violation(f"a reply in channel {channel_id} names {key} {reference[key]} "
                                             f"(replies must stay in the referenced message's channel)")
        found = self.state.find_message(channel_id, int(message_id))
        if found is None and reference.get("fail_if_not_exists", True) is not False:
            raise REFERENCE_UNKNOWN
        return found

    # -- interactions -----------------------------------------------------------------------

    async def interaction_callback(self, request: web.Request) -> web.StreamResponse:
        pending = self.state.interactions.get(self._snowflake(request, "interaction"))
        if pending is None or pending.token != request.match_info["token"]:
            raise UNKNOWN_INTERACTION
        if pending.response is not None:
            raise ALREADY_ACKNOWLEDGED
        body = request[BODY] or {}
        kind, data = body.get("type"), body.get("data")
        if pending.payload["type"] == AUTOCOMPLETE_INTERACTION:
            if kind != AUTOCOMPLETE_RESULT:
                raise DiscordError(400, 50035, "Invalid Form Body", {"type": {"_errors": [
                    {"code": "INTERACTION_RESPONSE_TYPE_INVALID", "message": "Invalid interaction response type"}]}})
            check_choices(data, _focused(pending.payload["data"]))
        elif kind == MESSAGE:
            check_message(data, at=("data",), ephemeral_allowed=True)
        elif kind == DEFERRED:
            if data is not None and (data.get("flags") or 0) & ~EPHEMERAL:
                raise DiscordError(400, 50035, "Invalid Form Body", {"data": {"flags": {"_errors": [
                    {"code": "MESSAGE_FLAGS_INVALID", "message": "Invalid flags"}]}}})
        elif kind == MODAL:
            if not (data and data.get("custom_id") and data.get("title") and data.get("components")):
                raise DiscordError(400, 50035, "Invalid Form Body", {"data": {"_errors": [
                    {"code": "BASE_TYPE_REQUIRED", "message": "custom_id, title and components are required"}]}})
        else:
            raise DiscordError(400, 50035, "Invalid Form Body", {"type": {"_errors": [
                {"code": "INTERACTION_RESPONSE_TYPE_INVALID", "message": "Invalid interaction response type"}]}})
        pending.response = body
        flags = (data or {}).get("flags") or 0
        if kind in (MESSAGE, DEFERRED):
            pending.original = message_payload(
                message_id=self.state.ids(), channel_id=pending.channel_id, guild_id=int(pending.payload["guild_id"]),
                author=self.state.bot, body=data if kind == MESSAGE else {}, application_id=self.state.application_id,
                message_type=CHAT_INPUT_COMMAND_MESSAGE, flags=flags | (LOADING if kind == DEFERRED else 0))
        if request.query.get("with_response") not in ("1", "true", "True"):
            return web.Response(status=204)
        result: dict[str, Any] = {"interaction": {
            "id": str(pending.id), "type": 2, "response_message_id": pending.original and pending.original["id"],
            "response_message_loading": kind == DEFERRED, "response_message_ephemeral": bool(flags & EPHEMERAL)}}
        if pending.original is not None:
            result["resource"] = {"type": kind, "message": pending.original}
        else:
            result["resource"] = {"type": kind}
        return json_response(200, result)

    def _answered(self, request: web.Request) -> PendingInteraction:
        pending = self.state.interaction_by_token(self._snowflake(request, "app"), request.match_info["token"])
        if pending is None or pending.response is None:
            raise UNKNOWN_WEBHOOK  # the webhook token only works once the interaction was answered
        return pending

    async def followup(self, request: web.Request) -> web.StreamResponse:
        pending = self._answered(request)
        check_message(request[BODY], ephemeral_allowed=True)
        body = request[BODY]
        message = message_payload(message_id=self.state.ids(), channel_id=pending.channel_id,
                                  guild_id=int(pending.payload["guild_id"]), author=self.state.bot, body=body,
                                  application_id=self.state.application_id, message_type=CHAT_INPUT_COMMAND_MESSAGE,
                                  flags=body.get("flags") or 0)
        pending.followups.append(message)
        if request.query.get("wait") in ("1", "true", "True"):
            return json_response(200, message)
        return web.Response(status=204)

    async def webhook_message(self, request: web.Request) -> web.StreamResponse:
        pending = self._answered(request)
        ref = request.match_info["message"]
        target = pending.original if ref == "@original" else next(
            (m for m in pending.followups if m["id"] == ref), None)
        if target is None:
            raise UNKNOWN_MESSAGE
        if request.method == "GET":
            return json_response(200, target)
        if request.method == "DELETE":
            if ref == "@original":
                pending.original = None
            else:
                pending.followups.remove(target)
            return web.Response(status=204)
        if request.method != "PATCH":
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "PATCH", "DELETE"])
        body = request[BODY] or {}
        check_message(body, edit=True, ephemeral_allowed=True)
        for key in ("content", "embeds", "components"):
            if key in body:
                target[key] = [{"type": "rich", **e} for e in body[key] or []] if key == "embeds" else body[key]
        target["flags"] &= ~LOADING
        target["edited_timestamp"] = target["timestamp"]
        pending.edits.append(body)
        return json_response(200, target)


def _focused(data: dict) -> dict:
    """The option being typed in an autocomplete interaction's (possibly nested) options."""
    for option in data.get("options") or []:
        if option.get("focused"):
            return option
        if option.get("options"):
            found = _focused(option)
            if found:
                return found
    return {}

