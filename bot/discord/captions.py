"""Live captions of a voice call: one line per turn in a public thread under the text channel.

The flow, in order: `CaptionThread.start()` creates the thread; the call engine's transcript handler
calls `add(role, name, text)` (synchronous, never raises); `caption_line` turns the turn into one
escaped line (`bot.discord.caption_log`); `CaptionLog`, the sans-I/O core, appends it to the current message (a new one once that
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
import time
from collections.abc import Awaitable, Callable

import aiohttp
import discord

from bot.discord.caption_log import (
    CaptionAction,
    CaptionLog,
    InvalidState,
    PostMessage,
    caption_line,
)
from bot.discord.posts import NO_PINGS
from common.visible import plain_line

log = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 8.0  # close() waits this long for pending lines: the last edit may wait out both limits
CREATE_TIMEOUT_S = 30.0
THREAD_NAME_MAX = 100
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
        where = plain_line(self._voice_channel_name)
        name = f"Call captions — {stamp}"
        if where:
            room = THREAD_NAME_MAX - len(name) - len(" — ")
            name = f"Call captions — {plain_line(where, room)} — {stamp}" if room > 1 else name
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
                self._posted[action.slot] = await thread.send(action.text, allowed_mentions=NO_PINGS,
                                                              suppress_embeds=True)
            else:
                self._posted[action.slot] = await self._posted[action.slot].edit(
                    content=action.text, allowed_mentions=NO_PINGS, suppress=True)
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
