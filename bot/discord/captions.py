"""Live captions of a voice call: one line per turn in a public thread under the text channel.

The flow, in order: `CaptionThread.start()` creates the thread; the call engine's transcript handler
calls `add(role, name, text)` (synchronous, never raises); `caption_line` turns the turn into one
escaped line; `CaptionLog`, the sans-I/O core, appends it to the current message (a new one once that
is about 1,800 characters or 10 s old) and decides when a request may go out — at most one per
message per 1.5 s and 5 per 5 s in the thread (Discord's per-channel write limit), so faster lines are
coalesced into the next edit; the shell's one worker task carries out each `PostMessage` /
`EditMessage` and reports back. A refused request (missing permission, deleted thread, Discord
down) is logged once, shown by `status()` and ends the captions; the call goes on.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import logging
import math
import re
import time
import unicodedata
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import discord

from bot.discord.untrusted import escape_caller_text

log = logging.getLogger(__name__)

MAX_CHARS = 1800  # per message: Discord allows 2,000; the rest is margin
MAX_AGE_S = 10.0  # a message takes new lines for this long after its first
EDIT_INTERVAL_S = 1.5  # between two requests for the same message
BURST, WINDOW_S = 5, 5.0  # requests per window in the thread (Discord's per-channel write limit)
NAME_MAX = 64  # code points of a display name (Discord's are ≤ 32); longer ones are cut
THREAD_NAME_MAX = 100
CREATE_TIMEOUT_S = 30.0
FLUSH_TIMEOUT_S = 8.0  # close() waits this long for pending lines: the last edit may wait out both limits
ELLIPSIS = "…"


# -- one line --------------------------------------------------------------------------------------

_SPACE = re.compile(r"\s+")


def caption_line(role: str, name: str | None, text: str, *, agent_name: str) -> str | None:
    """One caption line: `**{name}**: {text}` for a person, `**{agent_name} (assistant)**: {text}` for
    the assistant (`role == "assistant"`; any other role is a person). None when `text` shows nothing.

    The line is plain text on Discord whatever the caller said or is called: control and format
    characters (zero-width, bidi overrides) are dropped, newlines and runs of spaces become one space,
    markdown is escaped (`discord.utils.escape_markdown`), `@everyone`/`@here`/`<@id>`-style mentions are
    broken (`escape_mentions`), every bracket is escaped so no masked link `[x](url)` can form (not even
    across name and text), and every `<` is followed by a zero-width space so no `<@…>`, `<#…>`, `<@&…>`,
    `<t:…>` or `</…>` token is parsed. A person's name is cut to 64 characters and may not end like the
    assistant's marker. The line may be longer than a message; `CaptionLog` cuts it."""
    said = _plain(text)
    if not said:
        return None
    if role == "assistant":
        who = f"{_plain(agent_name, NAME_MAX) or 'Assistant'} (assistant)"
    else:
        who = _plain(name, NAME_MAX) or "Someone"
        if _reads_as_assistant(who):
            who += " (person)"
    return f"**{escape_caller_text(who)}**: {escape_caller_text(said)}"


def _plain(value: object, limit: int | None = None) -> str:
    """One line of visible text: control/format characters dropped, whitespace collapsed, cut to `limit`."""
    kept = []
    for ch in str(value or ""):
        kind = unicodedata.category(ch)
        if ch.isspace() or kind in ("Zl", "Zp"):
            kept.append(" ")
        elif kind not in ("Cc", "Cf", "Cs", "Co"):
            kept.append(ch)
    plain = _SPACE.sub(" ", "".join(kept)).strip()
    if limit is not None and len(plain) > limit:
        plain = plain[:limit - 1].rstrip() + ELLIPSIS
    return plain


def _reads_as_assistant(name: str) -> bool:
    folded = unicodedata.normalize("NFKC", name).casefold().replace(" ", "")
    return folded.endswith("(assistant)")


def discord_length(text: str) -> int:
    """Length as Discord may count it (UTF-16 code units): never less than `len`, so limits stay safe."""
    return len(text.encode("utf-16-le")) // 2


def cut_line(line: str, limit: int) -> str:
    """`line` if it fits in `limit`, else its start and "…", never ending in a lone escaping backslash."""
    if discord_length(line) <= limit:
        return line
    kept, used = [], 0
    for ch in line:
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > limit - 1:
            break
        kept.append(ch)
    head = "".join(kept)
    if (len(head) - len(head.rstrip("\\"))) % 2:
        head = head[:-1]
    return head + ELLIPSIS


# -- the core: which request, when -------------------------------------------------------------------


@dataclass(frozen=True)
class PostMessage:
    """Post `text` as a new message in the thread; it becomes our message number `slot` (0, 1, …)."""

    slot: int
    text: str


@dataclass(frozen=True)
class EditMessage:
    """Replace the content of our message `slot` (posted earlier) with `text`."""

    slot: int
    text: str


CaptionAction = PostMessage | EditMessage


class InvalidState(RuntimeError):
    """`CaptionLog.sent()` without a request in flight."""


@dataclass
class _Message:
    opened_at: float
    lines: list[str] = field(default_factory=list)
    size: int = 0
    shown: int = 0  # lines Discord has (its last request for this message succeeded with them)
    posted: bool = False
    last_request_at: float = -math.inf


class CaptionLog:
    """The batching rules, without I/O or a clock: every entry point takes `now` (seconds, monotonic).

    `add(now, line)` appends a line to the current message while that stays within `max_chars` and is
    younger than `max_age_s`, else opens the next. `due(now)` returns the one request to make now, if
    any; the caller reports its success with `sent(now)` (the completion time, so the limits hold at
    Discord whatever the latency) or gives up with `fail()`. One request is in flight at a time.
    Requests respect `min_interval_s` per message and `burst` per `window_s` overall; messages are
    posted in order. `wake_at()` is when `due` will next have work (None: nothing until the next add
    or `sent`). Every line added before `fail()` ends up in exactly one message, in order."""

    def __init__(self, *, max_chars: int = MAX_CHARS, max_age_s: float = MAX_AGE_S,
                 min_interval_s: float = EDIT_INTERVAL_S, burst: int = BURST, window_s: float = WINDOW_S) -> None:
        self.max_chars, self.max_age_s, self.min_interval_s = max_chars, max_age_s, min_interval_s
        self.window_s = window_s
        self._recent: deque[float] = deque(maxlen=burst)  # completion times of the last `burst` requests
        self._messages: dict[int, _Message] = {}  # slot -> message, while it may still need a request
        self._slots = 0
        self._in_flight: tuple[int, int] | None = None  # (slot, lines in the request)
        self.failed = False
        self.lines = 0  # added and kept (not dropped)
        self.shown = 0  # lines Discord has
        self.messages = 0  # messages posted
        self.dropped = 0  # lines that will never be shown (after `fail()`)

    @property
    def pending(self) -> bool:
        """Some kept line is not shown yet."""
        return not self.failed and self.shown < self.lines

    def add(self, now: float, line: str) -> None:
        if self.failed:
            self.dropped += 1
            return
        line = cut_line(line, self.max_chars)
        current = self._messages.get(self._slots - 1)
        if (current is None or now - current.opened_at >= self.max_age_s
                or current.size + 1 + discord_length(line) > self.max_chars):
            self._close_current()
            current = self._messages[self._slots] = _Message(opened_at=now)
            self._slots += 1
        current.size += discord_length(line) + (1 if current.lines else 0)
        current.lines.append(line)
        self.lines += 1

    def due(self, now: float) -> CaptionAction | None:
        if self.failed or self._in_flight is not None:
            return None
        ready_at, slot = self._next()
        if slot is None or ready_at > now:
            return None
        message = self._messages[slot]
        self._in_flight = (slot, len(message.lines))
        text = "\n".join(message.lines)
        return EditMessage(slot, text) if message.posted else PostMessage(slot, text)

    def sent(self, now: float) -> None:
        """The request `due` returned has succeeded (its message now shows what it carried)."""
        if self._in_flight is None:
            raise InvalidState("sent() without a request in flight")
        slot, count = self._in_flight
        self._in_flight = None
        message = self._messages[slot]
        self.shown += count - message.shown
        if not message.posted:
            message.posted = True
            self.messages += 1
        message.shown, message.last_request_at = count, now
        self._recent.append(now)
        if slot != self._slots - 1 and message.shown == len(message.lines):
            del self._messages[slot]  # closed and complete: never needs another request

    def fail(self) -> int:
        """Stop for good: lines not shown yet are dropped, later ones too. Returns how many so far."""
        if not self.failed:
            self.failed = True
            self.dropped += self.lines - self.shown
            self.lines = self.shown
            self._messages.clear()
            self._in_flight = None
        return self.dropped

    def wake_at(self) -> float | None:
        if self.failed or self._in_flight is not None:
            return None
        ready_at, slot = self._next()
        return None if slot is None else ready_at

    def _next(self) -> tuple[float, int | None]:
        """The earliest time a request may go out and for which message (the lowest slot on a tie)."""
        free_at = self._recent[0] + self.window_s if len(self._recent) == self._recent.maxlen else -math.inf
        best: tuple[float, int | None] = (math.inf, None)
        for slot, message in self._messages.items():  # slots in order
            if message.shown == len(message.lines):
                continue
            if message.posted:
                ready = max(free_at, message.last_request_at + self.min_interval_s)
            else:
                ready = max(free_at, message.opened_at)
            if ready < best[0]:
                best = (ready, slot)
            if not message.posted:
                break  # later messages are posted after this one
        return best

    def _close_current(self) -> None:
        current = self._messages.get(self._slots - 1)
        if current is not None and current.posted and current.shown == len(current.lines):
            del self._messages[self._slots - 1]  # complete, so no request for it is in flight


# -- the shell: a thread on Discord -----------------------------------------------------------------


class Phase(enum.Enum):
    """Where a `CaptionThread` is: NEW → STARTING → ON → CLOSED, or FAILED from STARTING or ON (final)."""

    NEW = "new"
    STARTING = "starting"
    ON = "on"
    FAILED = "failed"
    CLOSED = "closed"


_PERMISSION_NAMES = {"view_channel": "View Channel", "create_public_threads": "Create Public Threads",
                     "send_messages_in_threads": "Send Messages in Threads"}
_NO_PINGS = discord.AllowedMentions.none()


class CaptionThread:
    """Captions of one call in a public thread under `channel` (the text channel `/talk join` was used in).

    `await start()` creates the thread and starts the worker; `add()` may be called before, during and
    after (after `close()` it does nothing) and never raises; `status()` is one line for `/talk status`;
    `await close()` flushes what is pending (at most `flush_timeout_s`) and stops. Call it all from the
    event loop's thread. `clock`/`sleep` are injectable so tests run the pacing in virtual time."""

    def __init__(self, channel: discord.TextChannel, *, agent_name: str, voice_channel_name: str | None = None,
                 call_id: str = "-", clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                 started_at: datetime.datetime | None = None, core: CaptionLog | None = None,
                 create_timeout_s: float = CREATE_TIMEOUT_S, flush_timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        self._channel = channel
        self._agent_name = agent_name
        self._voice_channel_name = voice_channel_name
        self._call_id = call_id
        self._clock, self._sleep = clock, sleep
        self._started_at = started_at or discord.utils.utcnow()
        self._core = core or CaptionLog()
        self._create_timeout_s, self._flush_timeout_s = create_timeout_s, flush_timeout_s
        self._phase = Phase.NEW
        self._failure: str | None = None
        self._thread: discord.Thread | None = None
        self._posted: dict[int, discord.Message] = {}
        self._wake = asyncio.Event()
        self._worker: asyncio.Task | None = None

    @property
    def thread(self) -> discord.Thread | None:
        return self._thread

    @property
    def thread_name(self) -> str:
        stamp = self._started_at.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        where = _plain(self._voice_channel_name)
        name = f"Call captions — {stamp}"
        if where:
            room = THREAD_NAME_MAX - len(name) - len(" — ")
            name = f"Call captions — {_plain(where, room)} — {stamp}" if room > 1 else name
        return name

    async def start(self) -> discord.Thread | None:
        """Create the thread and start the worker. Returns the thread, or None when captions failed
        (`status()` says why). Never raises for Discord's answers."""
        if self._phase is not Phase.NEW:
            raise InvalidState(f"start() when {self._phase.value}")
        self._set_phase(Phase.STARTING)
        missing = self._missing({"send_messages_in_threads"})
        if missing:  # the thread would be created and stay empty
            self._fail(f"cannot post in threads in <#{self._channel.id}> (missing {missing})")
            return None
        try:
            thread = await asyncio.wait_for(self._channel.create_thread(
                name=self.thread_name, type=discord.ChannelType.public_thread, auto_archive_duration=60,
                reason="Live captions of a voice call"), self._create_timeout_s)
        except Exception as exc:  # captions never break the call
            self._fail(f"cannot create a thread in <#{self._channel.id}> ({self._why(exc)})")
            return None
        if self._phase is not Phase.STARTING:  # closed while the thread was being created
            return thread
        self._thread = thread
        self._set_phase(Phase.ON)
        self._worker = asyncio.get_running_loop().create_task(self._work(), name=f"captions-{self._call_id}")
        return thread

    def add(self, role: str, name: str | None, text: str) -> None:
        """One turn: `role` "user" (spoken by `name`) or "assistant". Never raises, never waits."""
        try:
            if self._phase is Phase.CLOSED:
                return
            line = caption_line(role, name, text, agent_name=self._agent_name)
            if line is None:
                return
            self._core.add(self._clock(), line)
            self._wake.set()
        except Exception:  # a caption is worth less than the call that is running
            log.exception("call %s: captions: a line was lost", self._call_id)

    def status(self) -> str:
        if self._phase is Phase.FAILED:
            dropped = self._core.dropped
            lost = f"; {dropped} line{'s' * (dropped != 1)} not shown" if dropped else ""
            return f"failed: {self._failure}{lost}"
        if self._phase is Phase.STARTING:
            return f"starting: creating a thread in <#{self._channel.id}>"
        if self._phase is Phase.ON and self._thread is not None:
            lines, messages = self._core.lines, self._core.messages
            return (f"on: {lines} line{'s' * (lines != 1)} in {messages} message{'s' * (messages != 1)} "
                    f"in <#{self._thread.id}>")
        return "off"

    async def close(self) -> None:
        """Flush pending lines (bounded by `flush_timeout_s`), then stop. Never raises."""
        if self._phase is Phase.CLOSED:
            return
        worker = self._worker
        if self._phase is not Phase.FAILED:
            self._set_phase(Phase.CLOSED)
        self._wake.set()
        if worker is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(worker), self._flush_timeout_s)
        except TimeoutError:
            worker.cancel()
            waiting = self._core.lines - self._core.shown
            log.warning("call %s: captions: %d line%s still waiting after %g s were not shown", self._call_id,
                        waiting, "s" * (waiting != 1), self._flush_timeout_s)
        except Exception:
            log.exception("call %s: captions: the worker failed", self._call_id)

    # -- the worker -----------------------------------------------------------------------------

    async def _work(self) -> None:
        try:
            while not self._core.failed:
                self._wake.clear()
                action = self._core.due(self._clock())
                if action is not None:
                    await self._carry_out(action)
                    continue
                if self._phase is Phase.CLOSED and not self._core.pending:
                    return
                await self._wait(self._core.wake_at())
        except Exception as exc:  # a bug here must not surface in the call
            log.exception("call %s: captions: the worker stopped", self._call_id)
            self._fail(f"stopped by an error ({type(exc).__name__})")

    async def _carry_out(self, action: CaptionAction) -> None:
        thread = self._thread
        assert thread is not None
        try:
            if isinstance(action, PostMessage):
                self._posted[action.slot] = await thread.send(action.text, allowed_mentions=_NO_PINGS,
                                                              suppress_embeds=True)
            else:
                self._posted[action.slot] = await self._posted[action.slot].edit(
                    content=action.text, allowed_mentions=_NO_PINGS, suppress=True)
        except (discord.HTTPException, OSError, TimeoutError, aiohttp.ClientError) as exc:
            self._fail(f"cannot post in <#{thread.id}> ({self._why(exc)})")
            return
        self._core.sent(self._clock())

    async def _wait(self, wake_at: float | None) -> None:
        """Until `add`/`close` sets the event, or until `wake_at` on the injected clock."""
        if wake_at is None:
            await self._wake.wait()
            return
        woken = asyncio.ensure_future(self._wake.wait())
        timer = asyncio.ensure_future(self._sleep(max(0.0, wake_at - self._clock())))
        try:
            await asyncio.wait((woken, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            timer.cancel()

    # -- failures -------------------------------------------------------------------------------

    def _fail(self, reason: str) -> None:
        if self._phase is Phase.FAILED:
            return
        dropped = self._core.fail()
        self._failure = reason
        self._set_phase(Phase.FAILED)
        log.warning("call %s: captions stopped: %s; %d line%s not shown (the call goes on)", self._call_id,
                    reason, dropped, "s" * (dropped != 1))

    def _why(self, exc: BaseException) -> str:
        if isinstance(exc, discord.Forbidden):
            missing = self._missing(set(_PERMISSION_NAMES))
            text = exc.text or "Missing Permissions"
            return f"{text}: {missing}" if missing else text
        if isinstance(exc, discord.NotFound):
            return exc.text or "it no longer exists"
        if isinstance(exc, discord.HTTPException):
            return f"HTTP {exc.status}: {(exc.text or exc.response.reason or '')[:200]}"
        if isinstance(exc, TimeoutError):
            return "Discord did not answer in time"
        return f"{type(exc).__name__}: {str(exc)[:200]}"

    def _missing(self, wanted: set[str]) -> str:
        """The permissions in `wanted` the bot lacks in the channel, per discord.py's cache ("" if unknown)."""
        try:
            me = self._channel.guild.me
            if me is None:
                return ""
            permissions = self._channel.permissions_for(me)
        except Exception:  # a partial channel or guild: Discord's answer alone will have to do
            return ""
        return ", ".join(label for attr, label in _PERMISSION_NAMES.items()
                         if attr in wanted and not getattr(permissions, attr))

    def _set_phase(self, phase: Phase) -> None:
        log.info("call %s: captions %s -> %s", self._call_id, self._phase.value, phase.value)
        self._phase = phase
