"""Per-speaker endpointing: every member of a call is heard on their own, and every utterance belongs
to exactly one person.

Pure bookkeeping for `CallCore` (no I/O, no clock, no model). Each tick the shell hands in, per
member who sent audio, one 20 ms frame (24 kHz mono) and the speech probability its VAD gave that
frame. A member who is mid-utterance and sent nothing this tick is heard as silence: Discord
clients stop sending when their user stops talking, so missing packets and a quiet VAD are the same
signal. A member who is not speaking and sends nothing costs nothing.

Utterances are kept in the order they *started* (`queue`), which is the order they are committed
to the provider: a remark that begins while someone else is talking is usually about what they are
saying, so the model hears the conversation in the order it happened, and the first speaker's audio
can stream into the provider's input buffer while they talk (the common case, one person at a time,
pays no extra delay). The price: a short remark inside a long one waits for the long one to end —
bounded by `max_turn_ms`, after which a turn is cut and the rest becomes the next one.

Every utterance keeps its audio until it is committed, so a dropped provider socket loses nothing
that was not yet committed: the new socket gets it again.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from voice.call.vad import SpeechVad, VadConfig

SILENT_FRAME = bytes(960)  # 20 ms of 24 kHz mono s16le


@dataclass
class Utterance:
    """One person's stretch of speech, from the VAD's start to its end (or the turn-length cap)."""

    seq: int
    user_id: int | None  # None: the transport could not say who (tools that change things refuse)
    name: str | None  # display name when it started: untrusted, quoted to the model as data
    started_at: float
    introduce: bool  # a speaker-context item names the speaker before the commit (a room, not a terminal)
    frames: list[bytes] = field(default_factory=list)  # prefix + speech + closing silence, in order
    sent: int = 0  # how many of `frames` are already in the provider's input buffer
    ended_at: float | None = None
    voiced_ms: int = 0  # frames the VAD called speech, in ms
    last_voice_at: float | None = None
    cut: bool = False  # ended by the turn-length cap, not by silence

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    @property
    def duration_ms(self) -> int:
        return len(self.frames) * 20


@dataclass(frozen=True)
class Heard:
    """What happened to the speakers in one tick."""

    started: tuple[Utterance, ...] = ()
    ended: tuple[Utterance, ...] = ()
    voiced: tuple[Utterance, ...] = ()  # utterances whose VAD said "speech" in this tick


class _Member:
    __slots__ = ("vad", "prefix", "utterance")

    def __init__(self, config: VadConfig, frame_ms: int) -> None:
        self.vad = SpeechVad(config, frame_ms, detector=_NO_DETECTOR)
        self.prefix: deque[bytes] = deque(maxlen=max(1, config.prefix_ms // frame_ms))
        self.utterance: Utterance | None = None


class _NoDetector:
    """Probabilities come with the frames: the VAD itself never runs a model here."""

    name = "given"

    def probability(self, frame: bytes) -> float:  # pragma: no cover - never called
        raise AssertionError("SpeakerTurns is fed probabilities, not frames to score")


_NO_DETECTOR = _NoDetector()


class SpeakerTurns:
    """Per-member VAD state and the queue of utterances not yet committed, in start order."""

    def __init__(self, config: VadConfig | None = None, frame_ms: int = 20, max_turn_ms: int = 30_000) -> None:
        self.config = config = config or VadConfig()
        self.frame_ms = frame_ms
        self.max_turn_ms = max_turn_ms
        self._members: dict[int | None, _Member] = {}
        self._seq = itertools.count(1)
        self.queue: deque[Utterance] = deque()  # started, not yet committed; in start order
        self.speaking: dict[int | None, Utterance] = {}  # who is mid-utterance now

    def hear(self, now: float, frames: dict[int | None, tuple[bytes, float]],
             names: dict[int | None, str] | None = None, *, introduce: bool = True) -> Heard:
        """One tick: each member's frame and its speech probability. Members mid-utterance who sent
        nothing are heard as silence."""
        started: list[Utterance] = []
        ended: list[Utterance] = []
        voiced: list[Utterance] = []
        for user_id in list(self.speaking):
            if user_id not in frames:
                self._push(user_id, SILENT_FRAME, 0.0, now, names, introduce, started, ended, voiced)
        for user_id, (pcm, probability) in frames.items():
            self._push(user_id, pcm, probability, now, names, introduce, started, ended, voiced)
        return Heard(tuple(started), tuple(ended), tuple(voiced))

    def _push(self, user_id: int | None, pcm: bytes, probability: float, now: float,
              names: dict[int | None, str] | None, introduce: bool, started: list[Utterance],
              ended: list[Utterance], voiced: list[Utterance]) -> None:
        member = self._members.get(user_id)
        if member is None:
            member = self._members[user_id] = _Member(self.config, self.frame_ms)
        decision = member.vad.push_probability(probability)
        if decision == "start":
            name = (names or {}).get(user_id)
            utterance = Utterance(next(self._seq), user_id, name, now, introduce)
            utterance.frames.extend(member.prefix)
            utterance.voiced_ms = self.config.start_ms
            utterance.last_voice_at = now
            member.prefix.clear()
            member.utterance = utterance
            self.speaking[user_id] = utterance
            self.queue.append(utterance)
            started.append(utterance)
            utterance.frames.append(pcm)
            voiced.append(utterance)
            return
        utterance = member.utterance
        if utterance is None:
            member.prefix.append(pcm)
            return
        utterance.frames.append(pcm)
        if probability >= self.config.speech_threshold:
            utterance.voiced_ms += self.frame_ms
            utterance.last_voice_at = now
            voiced.append(utterance)
        if decision == "end":
            self._end(user_id, member, now, ended)
        elif utterance.duration_ms >= self.max_turn_ms:
            utterance.cut = True
            self._end(user_id, member, now, ended)
            # still talking (the VAD is still in speech): the rest is their next turn
            nxt = Utterance(next(self._seq), user_id, utterance.name, now, utterance.introduce)
            member.utterance = nxt
            self.speaking[user_id] = nxt
            self.queue.append(nxt)
            started.append(nxt)

    def _end(self, user_id: int | None, member: _Member, now: float, ended: list[Utterance]) -> None:
        utterance = member.utterance
        assert utterance is not None
        utterance.ended_at = now
        member.utterance = None
        self.speaking.pop(user_id, None)
        ended.append(utterance)

    def drop(self, utterance: Utterance) -> None:
        """Forget an utterance that will never be committed (a backchannel over the assistant)."""
        if utterance in self.queue:
            self.queue.remove(utterance)

    def reset_sent(self) -> None:
        """The provider's input buffer is gone (a new socket): nothing queued is in it any more."""
        for utterance in self.queue:
            utterance.sent = 0

    @property
    def anyone_speaking(self) -> bool:
        return bool(self.speaking)

    def members(self) -> int:
        return len(self._members)
