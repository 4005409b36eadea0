"""The call state machine: floor, turns, barge-in, tool calls, announcements, reconnect.

Sans-I/O. Inputs are method calls (provider events, user audio frames, tool results, playback
notices), each with the current time and a `PlaybackPosition` snapshot of the speaker; outputs are
`Action`s the async shell carries out — including the turn records it writes. No clock, no files,
no shared objects: a test drives it with a list of inputs and reads a list of actions.

Attribution lives here: every committed turn records the exact speakers of the frames committed,
every response the core creates keeps its originating turn (tool follow-ups inherit it), and every
`RunTool` carries that origin. A response the core cannot trace to a turn has unknown attribution.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from dataclasses import dataclass, field

from voice.call import events as ev
from voice.call.actions import (
    SILENT,
    Action,
    AnnouncementResult,
    FinishItem,
    Notice,
    PlayAudio,
    PlaybackPosition,
    RecordTurn,
    RunTool,
    Send,
    ShowTranscript,
    StopPlayback,
)
from voice.call.attribution import UNKNOWN, Attribution, speaker_context_text
from voice.call.floor import Announcement, Floor
from voice.call.providers.base import RealtimeProvider, SessionConfig
from voice.call.transports.base import TurnContext
from voice.call.turn_record import TurnRecord
from voice.call.turns import TurnLedger
from voice.call.vad import LocalEndpointer, SpeechDetector, VadConfig

log = logging.getLogger(__name__)

RESTORE_ITEMS = 20
SPOKEN_ERROR_GAP_S = 30.0
USER_FACING_ERRORS = frozenset({"server_error", "rate_limit_exceeded", "insufficient_quota", "session_expired"})
RECONNECTED_NOTICE = "The connection to the voice service dropped for a moment and is back."


class CallState(enum.Enum):
    """NEW until `start`; OPEN while the provider socket is up; RECONNECTING between a drop and the
    new socket; ENDED after `end` (final: later inputs are no-ops, announcements are refused)."""

    NEW = "new"
    OPEN = "open"
    RECONNECTING = "reconnecting"
    ENDED = "ended"


class InvalidState(RuntimeError):
    """A lifecycle call made in a state that does not allow it (a bug in the shell)."""


# -- bookkeeping ----------------------------------------------------------------------------------


@dataclass
class _Response:
    response_id: str
    kind: str
    origin: Attribution
    announcement: Announcement | None = None
    turn: TurnRecord | None = None
    cancelled: bool = False
    calls: list[str] = field(default_factory=list)
    audio_items: list[str] = field(default_factory=list)
    done: bool = False
    followed_up: bool = False
    answers: tuple[str, ...] = ()


@dataclass
class _Call:
    call_id: str
    name: str
    arguments: str
    response_id: str
    origin: Attribution
    output: str | None = None
    output_sent: bool = False
    answered: bool = False  # the follow-up response to this call completed


@dataclass
class CallOptions:
    endpointing: str = "server"  # server | local
    vad: VadConfig = field(default_factory=VadConfig)
    semantic_vad: bool = False
    answer_wait_s: float = 5.0  # after server VAD ends a turn, its own answer comes first (at most this long)


class CallCore:
    """One call's conversation state. Every public method returns the actions to carry out."""

    def __init__(self, provider: RealtimeProvider, session: SessionConfig, options: CallOptions | None = None,
                 *, logger: logging.Logger | logging.LoggerAdapter | None = None,
                 detector: SpeechDetector | None = None) -> None:
        """`detector` decides speech in local endpointing (default: loudness, `EnergyDetector`); the
        shell injects a trained one. It is stateful: one per call."""
        self.provider = provider
        self.options = options or CallOptions()
        self.log = logger or log
        local = self.options.endpointing == "local"
        turn_detection = None if local else ("semantic_vad" if self.options.semantic_vad else "server_vad")
        self.session = SessionConfig(session.instructions, session.voice, session.tools, turn_detection,
                                     self.options.vad.silence_ms, session.transcribe_input)
        self.state = CallState.NEW
        self.user_speaking = False
        self.floor = Floor()
        self._responses: dict[str, _Response] = {}
        self._active: _Response | None = None
        self._calls: dict[str, _Call] = {}
        self._received_ms: dict[str, float] = {}  # item -> ms of audio received
        self._history: deque[tuple[str, str]] = deque(maxlen=RESTORE_ITEMS)
        self.turns = TurnLedger()
        self._endpointer: LocalEndpointer[TurnContext] = LocalEndpointer(self.options.vad, detector=detector)
        self._committed = UNKNOWN  # server endpointing: the turn the server's next answer belongs to
        self.counters: dict[str, int] = {"barge_ins": 0, "cancels_sent": 0, "stale_audio_dropped": 0,
                                         "tool_calls": 0, "announcements": 0, "reconnects": 0,
                                         "provider_errors": 0, "audio_dropped_offline": 0}
        self.last_error: str | None = None
        self._now = 0.0
        self._playback = SILENT
        self._last_spoken_problem = -SPOKEN_ERROR_GAP_S

    @property
    def connected(self) -> bool:
        return self.state is CallState.OPEN

    @property
    def ended(self) -> bool:
        return self.state is CallState.ENDED

    def _observe(self, now: float, playback: PlaybackPosition | None) -> None:
        self._now = now
        if playback is not None:
            self._playback = playback

    def _set_state(self, state: CallState) -> None:
        self.log.debug("call state %s -> %s", self.state.value, state.value)
        self.state = state

    def _out(self, actions: list[Action]) -> list[Action]:
        """Every entry point returns through here: finished turn records go out as actions."""
        records = self.turns.drain()
        return actions + [RecordTurn(r) for r in records] if records else actions

    # -- session ---------------------------------------------------------------------------------

    def start(self, now: float) -> list[Action]:
        """The socket is open: configure the session."""
        if self.state is not CallState.NEW:
            raise InvalidState(f"start() in state {self.state.value}")
        self._observe(now, None)
        self._set_state(CallState.OPEN)
        return [Send(self.provider.session_update(self.session))]

    def on_disconnect(self, now: float) -> list[Action]:
        """The socket dropped: whatever the server was doing is gone."""
        if self.state is not CallState.OPEN:
            return []  # already reconnecting, or ended
        self._observe(now, None)
        self._set_state(CallState.RECONNECTING)
        self.floor.lose_connection()
        if self._active is not None:
            self._active.cancelled = True
            self._active.done = True
            if self._active.announcement is not None:
                self.floor.announce(self._active.announcement, first=True)
            self._active = None
        for response in self._responses.values():
            response.followed_up = False
        self.turns.forget_heard()  # that audio buffer is gone with the socket
        return []

    def on_reconnected(self, now: float, playback: PlaybackPosition) -> list[Action]:
        """A new socket is open: restore instructions, tools, recent conversation, tool calls."""
        if self.state is CallState.ENDED:
            return []
        if self.state is not CallState.RECONNECTING:
            raise InvalidState(f"on_reconnected() in state {self.state.value}")
        self._observe(now, playback)
        self._set_state(CallState.OPEN)
        self.counters["reconnects"] += 1
        actions: list[Action] = [Send(self.provider.session_update(self.session))]
        for role, text in self._history:
            actions.append(Send(self.provider.add_text_item(role, text)))
        for response in list(self._responses.values()):
            calls = [self._calls[c] for c in response.calls]
            if not calls or all(c.answered for c in calls):
                continue
            for call in calls:  # the new session has never seen these calls: recreate them
                actions.append(Send(self.provider.add_function_call(call.call_id, call.name, call.arguments)))
                if call.output is not None:
                    actions.append(Send(self.provider.function_output(call.call_id, call.output)))
                    call.output_sent = True
            response.done = True
            self._maybe_follow_up(response)
        self.floor.announce(Announcement(0, RECONNECTED_NOTICE), first=True)
        actions.append(Notice("warning", "voice service connection restored"))
        return self._out(actions + self._pump())

    def end(self, now: float) -> list[Action]:
        """The call is over: every undelivered announcement is reported as not delivered. Idempotent."""
        if self.state is CallState.ENDED:
            return []
        self._observe(now, None)
        self._set_state(CallState.ENDED)
        pending = self.floor.close()
        if self._active is not None and self._active.announcement is not None:
            pending.append(self._active.announcement)
        actions: list[Action] = [AnnouncementResult(a.announcement_id, False) for a in pending if a.announcement_id]
        self.turns.close("ended")
        self.turns.flush_unheard()
        return self._out(actions)

    # -- user audio --------------------------------------------------------------------------------

    def on_user_audio(self, frame: bytes, now: float, playback: PlaybackPosition,
                      context: TurnContext | None = None) -> list[Action]:
        """One 20 ms frame of user audio (24 kHz mono) and who is in it."""
        if self.state is not CallState.OPEN:
            if self.state is CallState.RECONNECTING:
                self.counters["audio_dropped_offline"] += 1
            return []
        self._observe(now, playback)
        if self.options.endpointing == "server":
            self.turns.hear(context)
            actions: list[Action] = [Send(self.provider.append_audio(frame))]
            if self.floor.announcements and self._active is None and not self.floor.inflight:
                actions += self._pump()
            return self._out(actions)
        decision, frames = self._endpointer.push(frame, context)
        actions = []
        if decision == "start":
            actions += self._speech_started(now)
        for pcm, tag in frames:
            self.turns.hear(tag)
            actions.append(Send(self.provider.append_audio(pcm)))
        if decision == "end":
            actions += self._local_turn_end(now)
        return self._out(actions)

    def _local_turn_end(self, now: float) -> list[Action]:
        self.user_speaking = False
        turn = self.turns.new(now)
        origin, names = self.turns.commit(turn)
        actions: list[Action] = []
        context = speaker_context_text(origin.speakers or frozenset(), names)
        if context:
            actions.append(Send(self.provider.add_text_item("system", context)))
        actions.append(Send(self.provider.commit_audio()))
        turn.commit = now
        self.floor.want("turn", turn=turn, origin=origin)
        return actions + self._pump()

    def _speech_started(self, now: float) -> list[Action]:
        """Someone started talking: the floor is theirs. Barge in on the assistant if needed."""
        self.user_speaking = True
        actions: list[Action] = []
        position = self._playback
        active = self._active
        if position.playing or (active is not None and not active.cancelled and active.audio_items):
            self.counters["barge_ins"] += 1
            if position.playing:
                actions.append(StopPlayback())
            if position.playing and position.item_id in self._received_ms:
                item: str | None = position.item_id  # what the people in the call are hearing now
            else:
                item = self._current_audio_item()
            if item is not None:
                played = position.played_ms if item == position.item_id else 0
                heard = min(played, int(self._received_ms.get(item, 0)))
                actions.append(Send(self.provider.truncate(item, heard)))
        if active is not None and not active.cancelled and not active.done:
            actions += self._cancel(active)
        self.floor.interrupt_pending()
        current = self.turns.current
        if current is not None and current.response_created is not None:
            self.turns.close("interrupted")
        return actions

    def _cancel(self, response: _Response) -> list[Action]:
        response.cancelled = True
        self.counters["cancels_sent"] += 1
        return [Send(self.provider.cancel_response())]

    def _current_audio_item(self) -> str | None:
        active = self._active
        if active is not None and active.audio_items:
            return active.audio_items[-1]
        for response in reversed(list(self._responses.values())):
            if response.audio_items:
                return response.audio_items[-1]
        return None

    # -- provider events ----------------------------------------------------------------------------

    def on_provider(self, event: ev.ProviderEvent, now: float, playback: PlaybackPosition) -> list[Action]:
        if self.state is CallState.ENDED:
            return []
        self._observe(now, playback)
        handler = _HANDLERS.get(type(event))
        if handler is None:
            return []
        return self._out(handler(self, event, now))

    def _on_speech_started(self, event: ev.SpeechStarted, now: float) -> list[Action]:
        return self._speech_started(now)

    def _on_speech_stopped(self, event: ev.SpeechStopped, now: float) -> list[Action]:
        self.user_speaking = False
        self.turns.new(now)
        self.floor.await_answer(now + self.options.answer_wait_s)
        return self._pump()

    def _on_committed(self, event: ev.InputCommitted, now: float) -> list[Action]:
        if self.options.endpointing != "server":
            return []
        turn = self.turns.current
        if turn is None or turn.commit is not None:
            turn = self.turns.new(now)  # a commit without speech_stopped still starts a turn
        turn.commit = now
        self._committed, _ = self.turns.commit(turn)
        return []

    def _on_user_transcript(self, event: ev.UserTranscript, now: float) -> list[Action]:
        text = event.text.strip()
        if not text:
            return []
        self._history.append(("user", text))
        return [ShowTranscript("user", text)]

    def _on_response_created(self, event: ev.ResponseCreated, now: float) -> list[Action]:
        local = self.options.endpointing == "local"
        request = self.floor.match_created(event.metadata, fifo=local)
        if request is not None:
            kind, origin, turn = request.kind, request.origin, request.turn
        elif local:  # nothing of ours: the provider answered on its own, so nobody is known
            kind, origin, turn = "auto", UNKNOWN, None
        else:  # server endpointing: the server answers the turn it committed last
            kind, origin, turn = "auto", self._committed, self.turns.current
        response = _Response(event.response_id, kind, origin.for_response(event.response_id),
                             request.announcement if request else None, turn,
                             answers=request.answers if request else ())
        self._responses[event.response_id] = response
        self.floor.answer_arrived()
        self._trim_responses()
        self._active = response
        if turn is not None and turn.response_created is None:
            turn.response_created = now
        if request is not None and request.cancel_on_create:
            return self._cancel(response)
        return []

    def _on_audio_delta(self, event: ev.AudioDelta, now: float) -> list[Action]:
        response = self._responses.get(event.response_id)
        if response is not None and response.cancelled:
            self.counters["stale_audio_dropped"] += 1
            return []
        if response is None and event.response_id:
            response = self._adopt(event.response_id)
        if response is not None and event.item_id not in response.audio_items:
            response.audio_items.append(event.item_id)
        self._received_ms[event.item_id] = self._received_ms.get(event.item_id, 0.0) + len(event.pcm) / 48.0
        turn = response.turn if response else None
        if turn is not None and turn.first_audio_delta is None:
            turn.first_audio_delta = now
        return [PlayAudio(event.item_id, event.pcm)]

    def _adopt(self, response_id: str) -> _Response:
        """A response we never saw created: attributed like an unmatched `response.created`."""
        local = self.options.endpointing == "local"
        origin = UNKNOWN if local else self._committed
        response = _Response(response_id, "auto", origin.for_response(response_id),
                             turn=None if local else self.turns.current)
        self._responses[response_id] = response
        self._active = response
        return response

    def _on_audio_done(self, event: ev.AudioDone, now: float) -> list[Action]:
        response = self._responses.get(event.response_id)
        if response is not None and response.cancelled:
            return []
        return [FinishItem(event.item_id)]

    def _on_assistant_transcript(self, event: ev.AssistantTranscript, now: float) -> list[Action]:
        response = self._responses.get(event.response_id)
        if not event.final or not event.text.strip():
            return []
        if response is not None and response.cancelled:
            return [ShowTranscript("assistant", event.text.strip() + " [interrupted]")]
        self._history.append(("assistant", event.text.strip()))
        return [ShowTranscript("assistant", event.text.strip())]

    def _on_function_call(self, event: ev.FunctionCall, now: float) -> list[Action]:
        if event.call_id in self._calls:
            return []  # a repeated event must not run the tool twice
        response = self._responses.get(event.response_id) or self._adopt(event.response_id)
        call = _Call(event.call_id, event.name, event.arguments, event.response_id, response.origin)
        self._calls[event.call_id] = call
        response.calls.append(event.call_id)
        self.counters["tool_calls"] += 1
        return [RunTool(event.call_id, event.name, event.arguments, response.origin)]

    def _on_response_done(self, event: ev.ResponseDone, now: float) -> list[Action]:
        response = self._responses.get(event.response_id) or self._adopt(event.response_id)
        response.done = True
        if self._active is response:
            self._active = None
        actions: list[Action] = []
        turn = response.turn
        if turn is not None:
            turn.response_done = now
            turn.status = event.status
        if response.announcement is not None:
            actions += self._settle(response.announcement, event.status == "completed")
        if event.status == "completed":
            for call_id in response.answers:
                self._calls[call_id].answered = True
        if event.status == "failed":
            actions.append(Notice("warning", f"the response failed: {event.detail or 'no reason given'}"))
            if response.kind != "announce":
                self._speak_problem("the last answer failed on the voice service", now)
        actions += self._maybe_follow_up(response)
        if turn is not None and not response.calls and turn is self.turns.current:
            self.turns.close(event.status)
        return actions + self._pump()

    def _settle(self, announcement: Announcement | None, spoken: bool) -> list[Action]:
        if announcement is None or (not spoken and self.floor.retry_announcement(announcement)):
            return []
        return [AnnouncementResult(announcement.announcement_id, spoken)] if announcement.announcement_id else []

    def _on_error(self, event: ev.ProviderError, now: float) -> list[Action]:
        if event.harmless:
            return []
        self.counters["provider_errors"] += 1
        self.last_error = f"{event.code}: {event.message}"[:300]
        request = self.floor.take_inflight(event.event_id)
        if event.code == "conversation_already_has_active_response":
            self.floor.retry_later(request)
            return [Notice("info", "provider busy; response queued")]
        actions: list[Action] = [Notice("error", f"provider error {event.code}: {event.message}")]
        if request is not None:
            actions += self._settle(request.announcement, False)
        if event.code in USER_FACING_ERRORS:
            self._speak_problem(f"the voice service reported a problem ({event.message[:120]})", now)
        return actions + self._pump()

    def _speak_problem(self, text: str, now: float) -> None:
        """Tell the people in the call, at most once per SPOKEN_ERROR_GAP_S (never a loop)."""
        if now - self._last_spoken_problem < SPOKEN_ERROR_GAP_S:
            return
        self._last_spoken_problem = now
        self.floor.announce(Announcement(0, f"Sorry, {text}. I'm still listening."), first=True)

    # -- tools ------------------------------------------------------------------------------------------

    def on_tool_result(self, call_id: str, output: str, now: float, playback: PlaybackPosition,
                       elapsed_ms: float = 0.0) -> list[Action]:
        """A tool finished (or failed, or timed out). Answered exactly once."""
        call = self._calls.get(call_id)
        if call is None or call.output is not None or self.state is CallState.ENDED:
            return []
        self._observe(now, playback)
        call.output = output
        response = self._responses.get(call.response_id)
        if response is not None and response.turn is not None:
            response.turn.tool_ms += elapsed_ms
        if not self.connected:
            return []  # restored with its output on reconnect
        call.output_sent = True
        actions: list[Action] = [Send(self.provider.function_output(call_id, output))]
        if response is not None:
            actions += self._maybe_follow_up(response)
        return self._out(actions + self._pump())

    def _maybe_follow_up(self, response: _Response) -> list[Action]:
        """One response.create once every call of a finished response has its output.

        The follow-up inherits the origin of the response whose calls it answers, so a tool the model
        calls in a chained response is still attributed to the turn that started the chain.
        """
        if not response.calls or not response.done:
            return []
        calls = [self._calls[c] for c in response.calls]
        if response.followed_up or any(c.output is None or not c.output_sent for c in calls):
            return []
        response.followed_up = True
        self.floor.want("tool", turn=response.turn, answers=tuple(response.calls), origin=response.origin)
        return []

    # -- announcements --------------------------------------------------------------------------------

    def announce(self, announcement_id: int, text: str, now: float, playback: PlaybackPosition) -> list[Action]:
        """Queue something to say unprompted; spoken when the floor is free, with tools off."""
        if self.state is CallState.ENDED:
            return [AnnouncementResult(announcement_id, False)]
        self._observe(now, playback)
        self.floor.announce(Announcement(announcement_id, text))
        self.counters["announcements"] += 1
        return self._out(self._pump())

    def on_playback_idle(self, now: float, playback: PlaybackPosition) -> list[Action]:
        if self.state is CallState.ENDED:
            return []
        self._observe(now, playback)
        return self._out(self._pump())

    def tick(self, now: float, playback: PlaybackPosition) -> list[Action]:
        """Time passed (the shell calls this at `wake_at()`): a hold may have expired."""
        if self.state is CallState.ENDED:
            return []
        self._observe(now, playback)
        return self._out(self._pump())

    def wake_at(self) -> float | None:
        """When the core next needs `tick`, or None: an announcement held for the server's answer."""
        hold = self.floor.hold_announcements_until
        return hold if self.floor.announcements and hold > self._now else None

    def on_playback_started(self, item_id: str, now: float, playback: PlaybackPosition) -> list[Action]:
        self._observe(now, playback)
        for response in reversed(list(self._responses.values())):
            if item_id in response.audio_items:
                if response.turn is not None:
                    self.turns.first_played(response.turn, now)
                break
        return self._out([])

    # -- response scheduling ----------------------------------------------------------------------------

    def _pump(self) -> list[Action]:
        """Send the next wanted response when nothing else holds the floor."""
        busy = not self.connected or self._active is not None
        request = self.floor.next_request(now=self._now, busy=busy, user_speaking=self.user_speaking,
                                          playing=self._playback.playing)
        if request is None:
            return []
        event = self.provider.create_response(request.request)
        event["event_id"] = request.event_id
        return [Send(event)]

    # -- bookkeeping ----------------------------------------------------------------------------------

    def _trim_responses(self) -> None:
        while len(self._responses) > 64:
            oldest = next(iter(self._responses))
            response = self._responses.pop(oldest)
            for item in response.audio_items:
                self._received_ms.pop(item, None)

    # -- status -------------------------------------------------------------------------------------------

    def status(self) -> dict:
        return {
            "state": self.state.value,
            "connected": self.connected,
            "endpointing": self.options.endpointing,
            "user_speaking": self.user_speaking,
            "assistant_responding": self._active is not None,
            "pending_tool_calls": sum(1 for c in self._calls.values() if c.output is None),
            "queued_announcements": len(self.floor.announcements),
            "counters": dict(self.counters),
            "last_error": self.last_error,
        }

    def idle(self) -> bool:
        """Nothing in flight: no response, no queued work, no unanswered tool call."""
        return (self._active is None and self.floor.empty() and all(c.output is not None for c in self._calls.values())
                and not self.user_speaking)


_HANDLERS = {
    ev.SpeechStarted: CallCore._on_speech_started,
    ev.SpeechStopped: CallCore._on_speech_stopped,
    ev.InputCommitted: CallCore._on_committed,
    ev.UserTranscript: CallCore._on_user_transcript,
    ev.ResponseCreated: CallCore._on_response_created,
    ev.AudioDelta: CallCore._on_audio_delta,
    ev.AudioDone: CallCore._on_audio_done,
    ev.AssistantTranscript: CallCore._on_assistant_transcript,
    ev.FunctionCall: CallCore._on_function_call,
    ev.ResponseDone: CallCore._on_response_done,
    ev.ProviderError: CallCore._on_error,
}

__all__ = [
    "Action", "AnnouncementResult", "CallCore", "CallOptions", "CallState", "FinishItem", "InvalidState",
    "Notice", "PlayAudio", "PlaybackPosition", "RecordTurn", "RunTool", "Send", "ShowTranscript",
    "StopPlayback",
]
