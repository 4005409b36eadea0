"""The call state machine: floor, turns, barge-in, tool calls, announcements, reconnect.

Sans-I/O. Inputs are method calls (provider events, user audio frames, tool results, playback
notices), each with the current time and a `PlaybackPosition` snapshot of the speaker; outputs are
`Action`s the async shell carries out — including the turn records it writes. No clock, no files,
no shared objects: a test drives it with a list of inputs and reads a list of actions.

Attribution lives here: every committed turn records the exact speakers of the frames committed,
every response the core creates keeps its originating turn (tool follow-ups inherit it), and every
`RunTool` carries that origin. A response the core cannot trace to a turn has unknown attribution.

Sessions: the core keeps the last turns (`HistoryTurn`, with their speakers) and gives them to every
new session — after a dropped socket, after the provider ended one at its maximum duration, and at
`start` when the call resumes an earlier conversation. With `CallOptions.rollover_s` it also rolls
over before the provider's cap: once a session is that old, at a quiet moment (nobody speaking,
nothing playing, asked for, queued or awaiting its transcription) it asks the shell to open the next
session (`OpenNextSession`), configures it with the recent turns (`SendNext`), and swaps it in
(`SwapSession`) at the next quiet moment after it is ready. Nothing is said.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from voice.call import events as ev
from voice.call.actions import (
    SILENT,
    Action,
    AnnouncementResult,
    FinishItem,
    Notice,
    OpenNextSession,
    PausePlayback,
    PlayAudio,
    PlaybackPosition,
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
from voice.call.attribution import UNKNOWN, Attribution, speaker_context_text
from voice.call.floor import Announcement, Floor
from voice.call.history import HistoryTurn, restore_events
from voice.call.providers.base import RealtimeProvider, SessionConfig
from voice.call.speakers import SpeakerTurns, Utterance
from voice.call.transports.base import RoomTick, TurnContext
from voice.call.turn_record import TurnRecord
from voice.call.turns import TurnLedger
from voice.call.usage import NO_USAGE, CallUsage
from voice.call.vad import EnergyDetector, SpeechDetector, VadConfig

log = logging.getLogger(__name__)

RESTORE_ITEMS = 20
LIVE_APPEND_FRAMES = 5  # 100 ms
REPLAY_FRAMES = 25  # server endpointing: the last 500 ms of input go to the next session too (a word may start in them)
SPOKEN_ERROR_GAP_S = 30.0
USER_FACING_ERRORS = frozenset({"server_error", "rate_limit_exceeded", "insufficient_quota"})
# The provider ends a session at its maximum duration (GA: this error, then the socket closes): the next
# session opens with the recent turns, and nobody hears about it unless a turn was lost on the way.
SESSION_EXPIRED = "session_expired"
LOST_TURN_NOTICE = "The voice service started a new session and I missed the end of that. Could you say it again?"
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
class _Answering:
    """The committed turn the floor belongs to until its answer (and every follow-up) is done."""

    turn: TurnRecord
    origin: Attribution
    utterance: Utterance
    decided: bool  # everyone mode: at once; addressed mode: once the transcription says
    deadline: float = 0.0  # addressed mode: the transcription wait ends here
    item_id: str | None = None


REPLY_MODES = ("everyone", "addressed")


@dataclass
class CallOptions:
    endpointing: str = "server"  # server | local
    vad: VadConfig = field(default_factory=VadConfig)
    semantic_vad: bool = False
    answer_wait_s: float = 5.0  # after server VAD ends a turn, its own answer comes first (at most this long)
    reply_to: str = "everyone"  # everyone | addressed (local endpointing)
    addressed: Callable[[str], bool] | None = None  # does this transcription address the assistant by name?
    followup_s: float = 15.0  # addressed mode: the same speaker continuing this soon after an answer is answered
    transcript_wait_s: float = 5.0  # addressed mode: a turn whose transcription takes longer is left unanswered
    min_interruption_ms: int = 0  # speech over the assistant shorter than this pauses it, then it plays on
    max_turn_ms: int = 30_000  # a longer utterance is cut into turns (others waiting behind it get their go)
    rollover_s: float | None = None  # a session this old is replaced by the next one at a quiet moment (None: never)


class CallCore:
    """One call's conversation state. Every public method returns the actions to carry out."""

    def __init__(self, provider: RealtimeProvider, session: SessionConfig, options: CallOptions | None = None,
                 *, logger: logging.Logger | logging.LoggerAdapter | None = None,
                 detector: SpeechDetector | None = None, history: Sequence[HistoryTurn] = ()) -> None:
        """`detector` decides speech in local endpointing (default: loudness, `EnergyDetector`); the
        shell injects a trained one. It is stateful: one per call. `history`: an earlier conversation
        (oldest first; the last RESTORE_ITEMS are kept) that `start` gives the first session."""
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
        self._history: deque[HistoryTurn] = deque(history, maxlen=RESTORE_ITEMS)
        self._history_added = 0  # turns ever added (a prepared session is given those added since)
        self.spoken_ms: dict[int | None, int] = {}  # user id (None: unknown) -> voiced ms of their finished utterances
        self.turns = TurnLedger()
        self._detector: SpeechDetector = detector or EnergyDetector(self.options.vad.threshold_dbfs)
        self.speakers = SpeakerTurns(self.options.vad, max_turn_ms=self.options.max_turn_ms)
        self._owner: Utterance | None = None  # whose audio is in the provider's input buffer
        self._answering: _Answering | None = None
        self._uncommitted: deque[_Answering] = deque()  # commits sent, item id not yet known
        self._items: dict[str, _Answering] = {}  # committed user item -> its turn (recent ones)
        self._interrupters: list[Utterance] = []  # started over the assistant, not yet judged
        self._paused = False
        self._answered_at: dict[int, float] = {}  # user -> when the assistant last answered them
        self.reply_to = self.options.reply_to if self.options.reply_to in REPLY_MODES else "everyone"
        self._committed = UNKNOWN  # server endpointing: the turn the server's next answer belongs to
        self.counters: dict[str, int] = {"barge_ins": 0, "cancels_sent": 0, "stale_audio_dropped": 0,
                                         "tool_calls": 0, "announcements": 0, "reconnects": 0, "rollovers": 0,
                                         "provider_errors": 0, "audio_dropped_offline": 0, "turns": 0,
                                         "backchannels": 0, "resumed": 0, "addressed": 0, "followups": 0,
                                         "unanswered": 0, "transcripts_late": 0, "turns_cut": 0}
        self.last_error: str | None = None
        self.usage: CallUsage = NO_USAGE  # what the provider reported, summed over the call (every session)
        self._now = 0.0
        self._playback = SILENT
        self._last_spoken_problem = -SPOKEN_ERROR_GAP_S
        self._expiring = False  # the provider said the session hit its maximum duration
        self._rollover_lost_turn = False  # a turn was being answered when that session ended
        self._session_opened_at = 0.0  # when the current session's socket opened
        self._next = "none"  # the next session: none | opening | ready (a proactive rollover)
        self._next_opened_at = 0.0
        self._next_mark = 0  # `_history_added` when the next session was given the history
        self._recent_audio: deque[bytes] = deque(maxlen=REPLAY_FRAMES)  # server endpointing's last input
        self._transcripts_due: dict[str, float] = {}  # committed item -> until when its transcription may come

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
        """Every entry point returns through here: the floor moves on if a turn's answer is over, and
        finished turn records go out as actions."""
        if self._answering is not None:
            actions = actions + self._settle_answering()
        if self.options.rollover_s is not None:
            actions = actions + self._rollover()
        records = self.turns.drain()
        return actions + [RecordTurn(r) for r in records] if records else actions

    # -- session ---------------------------------------------------------------------------------

    def start(self, now: float) -> list[Action]:
        """The socket is open: configure the session, and give it the history the call began with."""
        if self.state is not CallState.NEW:
            raise InvalidState(f"start() in state {self.state.value}")
        self._observe(now, None)
        self._set_state(CallState.OPEN)
        self._session_opened_at = now
        return [Send(event) for event in self._session_events([])]  # no tool call can be pending yet

    def on_disconnect(self, now: float) -> list[Action]:
        """The socket dropped: whatever the server was doing is gone."""
        if self.state is not CallState.OPEN:
            return []  # already reconnecting, or ended
        self._observe(now, None)
        self._set_state(CallState.RECONNECTING)
        if self._expiring:  # lost: an answer still streaming, or a committed turn not answered yet
            answering = self._answering
            self._rollover_lost_turn = self._active is not None or (answering is not None and not any(
                r.turn is answering.turn for r in self._responses.values()))
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
        # The turn being answered is gone with the session; what was not committed yet is kept and
        # appended again on the new socket.
        self._answering = None
        self._uncommitted.clear()
        self._owner = None
        self.speakers.reset_sent()
        self._interrupters.clear()
        self._transcripts_due.clear()  # gone with the session
        self._next = "none"  # the shell drops a session it was preparing
        return self._resume()

    def on_reconnected(self, now: float, playback: PlaybackPosition) -> list[Action]:
        """A new socket is open: restore instructions, tools, recent conversation, tool calls."""
        if self.state is CallState.ENDED:
            return []
        if self.state is not CallState.RECONNECTING:
            raise InvalidState(f"on_reconnected() in state {self.state.value}")
        self._observe(now, playback)
        self._set_state(CallState.OPEN)
        self._session_opened_at = now
        self.counters["reconnects"] += 1
        unanswered = self._unanswered()
        actions: list[Action] = [Send(event) for event in self._session_events(unanswered)]
        for response, calls in unanswered:  # recreated in the new session, their outputs with them
            for call in calls:
                if call.output is not None:
                    call.output_sent = True
            response.done = True
            self._maybe_follow_up(response)
        if self._expiring:  # a rollover: silent, unless a turn was lost with the old session
            self._expiring = False
            self.counters["rollovers"] += 1
            if self._rollover_lost_turn:
                self.floor.announce(Announcement(0, LOST_TURN_NOTICE), first=True)
            actions.append(Notice("info", "the next voice session is open with the recent turns"))
        else:
            self.floor.announce(Announcement(0, RECONNECTED_NOTICE), first=True)
            actions.append(Notice("warning", "voice service connection restored"))
        return self._out(actions + self._advance(now) + self._pump())

    # -- proactive rollover: the next session is opened and swapped in while the room is quiet -------

    def rollover_due(self, now: float) -> bool:
        """The current session is `rollover_s` old (and not already ending on the provider's side)."""
        rollover_s = self.options.rollover_s
        return (rollover_s is not None and self.state is CallState.OPEN and not self._expiring
                and now - self._session_opened_at >= rollover_s)

    def on_next_session_open(self, now: float, playback: PlaybackPosition) -> list[Action]:
        """The socket `OpenNextSession` asked for is open: what to send it (`SendNext`), in order —
        the session's configuration, the recent turns, the tool calls not answered yet. Report
        `on_next_session_ready` once they are sent."""
        if self.state is CallState.ENDED:
            return []
        if self._next != "opening" or self.state is not CallState.OPEN:
            raise InvalidState(f"on_next_session_open() with the next session {self._next}, call {self.state.value}")
        self._observe(now, playback)
        self._next_opened_at = now
        self._next_mark = self._history_added
        return [SendNext(event) for event in self._session_events(self._unanswered())]

    def _unanswered(self) -> list[tuple[_Response, list[_Call]]]:
        """Responses whose tool calls are not all answered yet, with those calls."""
        pending = []
        for response in self._responses.values():
            calls = [self._calls[c] for c in response.calls]
            if calls and not all(c.answered for c in calls):
                pending.append((response, calls))
        return pending

    def _session_events(self, unanswered: list[tuple[_Response, list[_Call]]]) -> list[dict]:
        """What a fresh session is given, in order: its configuration, the recent turns, and the tool calls
        not answered yet with the outputs they have (the new session has never seen them)."""
        events = [self.provider.session_update(self.session), *restore_events(self.provider, self._history)]
        for _response, calls in unanswered:
            for call in calls:
                events.append(self.provider.add_function_call(call.call_id, call.name, call.arguments))
                if call.output is not None:
                    events.append(self.provider.function_output(call.call_id, call.output))
        return events

    def on_next_session_ready(self, now: float, playback: PlaybackPosition) -> list[Action]:
        """Everything `on_next_session_open` returned has been sent: swap at the next quiet moment (now, if it is)."""
        if self.state is CallState.ENDED:
            return []
        if self._next != "opening":
            raise InvalidState(f"on_next_session_ready() with the next session {self._next}")
        self._observe(now, playback)
        self._set_next("ready")
        return self._out([])

    def on_next_session_lost(self, now: float) -> list[Action]:
        """The next session could not be used (it closed before the swap): the current one goes on, and
        another is opened at a later quiet moment (the shell paces its attempts)."""
        if self._next != "none":
            self._set_next("none")
        return []

    def _set_next(self, state: str) -> None:
        self.log.debug("next session %s -> %s", self._next, state)
        self._next = state

    def _rollover(self) -> list[Action]:
        if self._next == "opening" or not self.rollover_due(self._now) or not self._quiet():
            return []
        if self._next == "none":
            self._set_next("opening")
            return [OpenNextSession()]
        return self._swap()

    def _swap(self) -> list[Action]:
        """The prepared session becomes the current one: it gets the turns added since it was prepared
        (and, with server endpointing, the last half second of input), and nobody hears a thing."""
        age = self._now - self._session_opened_at
        self._set_next("none")
        self._session_opened_at = self._next_opened_at
        self.counters["rollovers"] += 1
        added = min(self._history_added - self._next_mark, len(self._history))
        recent = list(self._history)[len(self._history) - added:] if added else []
        actions: list[Action] = [SwapSession()]
        actions += [Send(event) for event in restore_events(self.provider, recent)]
        if self._recent_audio:
            actions.append(Send(self.provider.append_audio(b"".join(self._recent_audio))))
        self._owner = None
        self.speakers.reset_sent()
        actions.append(Notice("info", f"rolled over to the next voice session after {age:.0f} s, with the recent turns"))
        return actions

    def _quiet(self) -> bool:
        """Nobody speaking or waiting for an answer, nothing playing, asked for, queued, running or
        awaiting its transcription: the session can change hands without anyone hearing it."""
        return (not self.user_speaking and not self.speakers.speaking and not self.speakers.queue
                and self._answering is None and not self._uncommitted and not self._interrupters
                and self._active is None and self.floor.empty() and self.floor.hold_announcements_until <= self._now
                and not self._playback.playing and not self._paused
                and all(c.output_sent for c in self._calls.values()) and not self._transcribing())

    def _transcribing(self) -> bool:
        for item, until in list(self._transcripts_due.items()):
            if until <= self._now:
                del self._transcripts_due[item]  # it is not coming: the turn stays without its words
        return bool(self._transcripts_due)

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
        """One 20 ms frame of one speaker's audio (24 kHz mono) and who that is (a terminal, a file)."""
        if self.state is not CallState.OPEN:
            if self.state is CallState.RECONNECTING:
                self.counters["audio_dropped_offline"] += 1
            return []
        self._observe(now, playback)
        if self.options.endpointing == "server":
            self.turns.hear(context)
            self._recent_audio.append(frame)
            actions: list[Action] = [Send(self.provider.append_audio(frame))]
            if self.floor.announcements and self._active is None and not self.floor.inflight:
                actions += self._pump()
            return self._out(actions)
        speaker = next(iter(context.speakers)) if context is not None and len(context.speakers) == 1 else None
        name = context.names.get(speaker) if context is not None and speaker is not None else None
        names = {speaker: name} if name else {}
        frames = {speaker: (frame, self._detector.probability(frame))}
        return self._out(self._hear(now, frames, names, introduce=bool(name)))

    def on_room_audio(self, tick: RoomTick, now: float, playback: PlaybackPosition) -> list[Action]:
        """One 20 ms tick of a room: each member's own frame and speech probability (local endpointing)."""
        if self.state is not CallState.OPEN:
            if self.state is CallState.RECONNECTING and tick.frames:
                self.counters["audio_dropped_offline"] += 1
            return []
        self._observe(now, playback)
        frames: dict[int | None, tuple[bytes, float]] = {
            user_id: (heard.pcm, heard.probability) for user_id, heard in tick.frames.items()}
        return self._out(self._hear(now, frames, dict(tick.names), introduce=True))

    def _hear(self, now: float, frames: dict[int | None, tuple[bytes, float]], names: dict, *,
              introduce: bool) -> list[Action]:
        heard = self.speakers.hear(now, frames, names, introduce=introduce)
        actions: list[Action] = []
        for utterance in heard.started:
            actions += self._utterance_started(utterance, now)
        if self._interrupters:
            actions += self._judge_interruptions(now)
        for utterance in heard.ended:
            self.spoken_ms[utterance.user_id] = self.spoken_ms.get(utterance.user_id, 0) + utterance.voiced_ms
            if utterance.cut:
                self.counters["turns_cut"] += 1
        self.user_speaking = self.speakers.anyone_speaking
        actions += self._advance(now)
        return actions + self._pump()

    # -- the room's floor: one turn at a time, in the order people started speaking ---------------------

    def _advance(self, now: float) -> list[Action]:
        """Stream the first waiting speaker's audio into the input buffer; commit their turn once it
        has ended and the turn before it has been answered (or deliberately left unanswered)."""
        actions: list[Action] = []
        queue = self.speakers.queue
        while queue and self.connected:
            head = queue[0]
            self._owner = head
            # Live audio goes out in 100 ms appends (a fifth of the messages, the framing and the syscalls
            # of one per frame); the rest of a turn goes out just before its commit.
            if len(head.frames) - head.sent >= (1 if head.ended else LIVE_APPEND_FRAMES):
                actions += self._append(head)
            if not head.ended or self._answering is not None:
                break
            queue.popleft()
            self._owner = None
            actions += self._commit(head, now)
        return actions

    def _append(self, utterance: Utterance) -> list[Action]:
        """What of the utterance is not in the input buffer yet, in appends of at most one second."""
        pending = utterance.frames[utterance.sent:]
        utterance.sent = len(utterance.frames)
        return [Send(self.provider.append_audio(b"".join(pending[i:i + 50]))) for i in range(0, len(pending), 50)]

    def _commit(self, utterance: Utterance, now: float) -> list[Action]:
        turn = self.turns.new(now)
        turn.speech_end = utterance.ended_at
        turn.commit = now
        speakers = frozenset({utterance.user_id}) if utterance.user_id is not None else None
        turn.speakers = sorted(speakers or ())
        origin = Attribution(None, turn.turn, speakers)
        actions: list[Action] = []
        if utterance.introduce and utterance.user_id is not None:
            names = {utterance.user_id: utterance.name} if utterance.name else {}
            actions.append(Send(self.provider.add_text_item(
                "system", speaker_context_text(frozenset({utterance.user_id}), names, always=True))))
        actions.append(Send(self.provider.commit_audio()))
        utterance.frames = []  # committed: the provider has it now
        self.counters["turns"] += 1
        answering = _Answering(turn, origin, utterance, decided=self.reply_to == "everyone",
                               deadline=now + self.options.transcript_wait_s)
        self._answering = answering
        self._uncommitted.append(answering)
        if answering.decided:
            self.floor.want("turn", turn=turn, origin=origin)
        return actions

    def _settle_answering(self) -> list[Action]:
        """The floor moves on once the committed turn's answer chain is over."""
        answering = self._answering
        if answering is None or not self.connected or self._chain_open(answering):
            return []
        self._answering = None
        if answering in self._uncommitted:  # its commit was never confirmed (refused): it must not take the next one's
            self._uncommitted.remove(answering)
        return self._advance(self._now) + self._pump()

    def _chain_open(self, answering: _Answering) -> bool:
        if not answering.decided:
            return True
        turn_id = answering.turn.turn
        if any(r.origin.turn_id == turn_id for r in (*self.floor.queue, *self.floor.inflight)):
            return True
        for response in self._responses.values():
            if response.origin.turn_id != turn_id:
                continue
            if not response.done or (response.calls and not response.followed_up):
                return True
        return False

    def _decide(self, answering: _Answering, text: str | None, now: float) -> list[Action]:
        """Addressed mode: answer a turn that names the assistant, or continues a conversation with it."""
        answering.decided = True
        user = answering.utterance.user_id
        named = bool(text) and self.options.addressed is not None and self.options.addressed(text or "")
        since = self._answered_at.get(user) if user is not None else None
        follows = since is not None and answering.utterance.started_at - since <= self.options.followup_s
        answer = named or follows
        if answer:
            self.counters["addressed" if named else "followups"] += 1
            self.floor.want("turn", turn=answering.turn, origin=answering.origin)
        else:
            self.counters["unanswered"] += 1
            self.turns.close("unanswered")
        actions: list[Action] = []
        if answering.utterance in self._interrupters:
            self._interrupters.remove(answering.utterance)
            if answer:
                actions += self._barge_in(now)
            elif not self._interrupters:
                actions += self._resume()
        return actions + self._pump()

    # -- interruptions: pause at once, then cancel or play on ---------------------------------------------

    def _assistant_audible(self) -> bool:
        active = self._active
        return (self._playback.playing or self._paused
                or (active is not None and not active.cancelled and not active.done)
                or any(r.kind in ("turn", "announce") for r in self.floor.inflight))

    def _utterance_started(self, utterance: Utterance, now: float) -> list[Action]:
        if not self._assistant_audible():
            return []
        self._interrupters.append(utterance)
        actions: list[Action] = []
        if not self._paused:
            self._paused = True
            actions.append(PausePlayback())
        return actions

    def _judge_interruptions(self, now: float) -> list[Action]:
        """Long enough over the assistant: a real interruption (addressed mode: once its words are
        known). Ended sooner: a cough or an "uh-huh" — forgotten, and the answer plays on."""
        actions: list[Action] = []
        for utterance in list(self._interrupters):
            if utterance.voiced_ms >= self.options.min_interruption_ms and utterance.voiced_ms > 0:
                if self.reply_to == "everyone":
                    self._interrupters.clear()
                    return actions + self._barge_in(now)
                continue  # addressed mode: judged by its transcription (`_decide`)
            if utterance.ended:
                self._interrupters.remove(utterance)
                self.counters["backchannels"] += 1
                if utterance is self._owner:
                    actions.append(Send(self.provider.clear_audio()))
                    self._owner = None
                self.speakers.drop(utterance)
        if not self._interrupters and self._paused:
            actions += self._resume()
        return actions

    def _resume(self) -> list[Action]:
        if not self._paused:
            return []
        self._paused = False
        self.counters["resumed"] += 1
        return [ResumePlayback()]

    def _barge_in(self, now: float) -> list[Action]:
        """A real interruption: stop the assistant where the room stopped hearing it, cancel its answer."""
        actions: list[Action] = []
        position = self._playback
        active = self._active
        was_paused, self._paused = self._paused, False
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
        elif was_paused:
            actions.append(StopPlayback())  # paused before any audio played: drop what queued meanwhile
        if active is not None and not active.cancelled and not active.done:
            actions += self._cancel(active)
        self.floor.interrupt_pending()
        current = self.turns.current
        if current is not None and current.response_created is not None:
            self.turns.close("interrupted")
        return actions

    def _speech_started(self, now: float) -> list[Action]:
        """Server endpointing: the server heard speech start; barge in on the assistant if needed."""
        self.user_speaking = True
        return self._barge_in(now)

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
        if event.item_id and self.session.transcribe_input:
            self._transcripts_due[event.item_id] = now + self.options.transcript_wait_s
            while len(self._transcripts_due) > 64:
                self._transcripts_due.pop(next(iter(self._transcripts_due)))
        if self.options.endpointing != "server":
            if self._uncommitted and event.item_id:  # our commits are answered in the order we sent them
                answering = self._uncommitted.popleft()
                answering.item_id = event.item_id
                self._items[event.item_id] = answering
                while len(self._items) > 64:
                    self._items.pop(next(iter(self._items)))
            return []
        turn = self.turns.current
        if turn is None or turn.commit is not None:
            turn = self.turns.new(now)  # a commit without speech_stopped still starts a turn
        turn.commit = now
        self._committed, _ = self.turns.commit(turn)
        return []

    def _on_user_transcript(self, event: ev.UserTranscript, now: float) -> list[Action]:
        text = event.text.strip()
        self._transcripts_due.pop(event.item_id or "", None)
        answering = self._items.get(event.item_id or "")
        actions: list[Action] = []
        if answering is not None and answering is self._answering and not answering.decided:
            actions += self._decide(answering, text, now)
        if not text:
            return actions
        if answering is None:
            self._remember(HistoryTurn("user", text))
            return actions + [ShowTranscript("user", text)]
        utterance = answering.utterance
        self._remember(HistoryTurn("user", text, utterance.user_id, utterance.name))
        return actions + [ShowTranscript("user", text, utterance.user_id, utterance.name)]

    def _remember(self, turn: HistoryTurn) -> None:
        self._history.append(turn)
        self._history_added += 1

    def _on_user_transcript_failed(self, event: ev.UserTranscriptFailed, now: float) -> list[Action]:
        self._transcripts_due.pop(event.item_id or "", None)
        answering = self._items.get(event.item_id or "")
        if answering is not None and answering is self._answering and not answering.decided:
            return self._decide(answering, None, now)
        return []

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
        self._remember(HistoryTurn("assistant", event.text.strip()))
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
        self._answered(response, now)
        if event.status == "failed":
            actions.append(Notice("warning", f"the response failed: {event.detail or 'no reason given'}"))
            if response.kind != "announce":
                self._speak_problem("the last answer failed on the voice service", now)
        actions += self._maybe_follow_up(response)
        if turn is not None and not response.calls and turn is self.turns.current:
            self.turns.close(event.status)
        return actions + self._pump()

    def _on_usage(self, event: ev.UsageReported, now: float) -> list[Action]:
        self.usage = self.usage + event.usage
        return [RecordUsage(self.usage)]

    def _settle(self, announcement: Announcement | None, spoken: bool) -> list[Action]:
        if announcement is None or (not spoken and self.floor.retry_announcement(announcement)):
            return []
        return [AnnouncementResult(announcement.announcement_id, spoken)] if announcement.announcement_id else []

    def _on_error(self, event: ev.ProviderError, now: float) -> list[Action]:
        if event.harmless:
            return []
        if event.code == SESSION_EXPIRED:  # not a failure: the socket closes next, and a new session opens
            self._expiring = True
            return [Notice("info", "the voice session reached its maximum duration; opening the next one")]
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
        for response in reversed(list(self._responses.values())):  # a follow-up counts from the answer's end
            if playback.item_id in response.audio_items:
                self._answered(response, now)
                break
        return self._out(self._pump())

    def tick(self, now: float, playback: PlaybackPosition) -> list[Action]:
        """Time passed (the shell calls this at `wake_at()`): a hold or a transcription wait may have expired."""
        if self.state is CallState.ENDED:
            return []
        self._observe(now, playback)
        actions: list[Action] = []
        answering = self._answering
        if answering is not None and not answering.decided and now >= answering.deadline:
            self.counters["transcripts_late"] += 1
            actions += self._decide(answering, None, now)
        return self._out(actions + self._pump())

    def wake_at(self) -> float | None:
        """When the core next needs `tick`, or None: an announcement held for the server's answer, the
        end of a transcription wait (addressed mode), or — with `rollover_s` — the session's rollover
        age and, past it, the timed waits the next quiet moment depends on."""
        hold = self.floor.hold_announcements_until
        times = [hold] if self.floor.announcements and hold > self._now else []
        answering = self._answering
        if answering is not None and not answering.decided:
            times.append(answering.deadline)
        rollover_s = self.options.rollover_s
        if rollover_s is not None and self.state is CallState.OPEN and self._next != "opening":
            due = self._session_opened_at + rollover_s
            waits = [due] if due > self._now else [hold, *self._transcripts_due.values()]
            times += [t for t in waits if t > self._now]
        return min(times) if times else None

    def _answered(self, response: _Response, now: float) -> None:
        """The assistant answered one person now (a follow-up window for addressed mode starts)."""
        speakers = response.origin.speakers
        if response.kind in ("turn", "tool") and speakers and len(speakers) == 1:
            (user,) = speakers
            self._answered_at[user] = now

    def set_reply_to(self, mode: str) -> None:
        """`everyone` answers every turn; `addressed` only turns that name the assistant (or follow up)."""
        if mode not in REPLY_MODES:
            raise ValueError(f"reply mode must be one of {', '.join(REPLY_MODES)}")
        self.reply_to = mode

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
            "reply_to": self.reply_to,
            "speaking_now": len(self.speakers.speaking),
            "turns_waiting": len(self.speakers.queue),
            "paused": self._paused,
            "assistant_responding": self._active is not None,
            "pending_tool_calls": sum(1 for c in self._calls.values() if c.output is None),
            "queued_announcements": len(self.floor.announcements),
            "counters": dict(self.counters),
            "spoken_ms": {("unattributed" if user is None else str(user)): ms for user, ms in self.spoken_ms.items()},
            "last_error": self.last_error,
        }

    @property
    def history(self) -> tuple[HistoryTurn, ...]:
        """The recent turns a new session is given (oldest first)."""
        return tuple(self._history)

    def idle(self) -> bool:
        """Nothing in flight: no response, no queued work, no unanswered tool call."""
        return (self._active is None and self.floor.empty() and all(c.output is not None for c in self._calls.values())
                and not self.user_speaking and not self.speakers.queue and self._answering is None)


_HANDLERS = {
    ev.SpeechStarted: CallCore._on_speech_started,
    ev.SpeechStopped: CallCore._on_speech_stopped,
    ev.InputCommitted: CallCore._on_committed,
    ev.UserTranscript: CallCore._on_user_transcript,
    ev.UserTranscriptFailed: CallCore._on_user_transcript_failed,
    ev.ResponseCreated: CallCore._on_response_created,
    ev.AudioDelta: CallCore._on_audio_delta,
    ev.AudioDone: CallCore._on_audio_done,
    ev.AssistantTranscript: CallCore._on_assistant_transcript,
    ev.FunctionCall: CallCore._on_function_call,
    ev.ResponseDone: CallCore._on_response_done,
    ev.UsageReported: CallCore._on_usage,
    ev.ProviderError: CallCore._on_error,
}

__all__ = [
    "Action", "AnnouncementResult", "CallCore", "CallOptions", "CallState", "FinishItem", "HistoryTurn", "InvalidState",
    "Notice", "OpenNextSession", "PausePlayback", "PlayAudio", "PlaybackPosition", "RecordTurn", "RecordUsage",
    "ResumePlayback", "RunTool", "Send", "SendNext", "ShowTranscript", "StopPlayback", "SwapSession",
]
