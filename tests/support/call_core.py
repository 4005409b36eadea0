"""A call core driven by hand, for the call-core tests: `make_core()` gives the core (with a fake
provider's event translation) and the speaker it plays to; `speak` feeds frames with who said them.

Real `CallCore`, real OpenAI GA translation; every event the core sends is checked against the GA
schema (`tests.support.realtime_schema`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tests.support.realtime_schema import validate_client_event
from voice.call.core import (
    CallCore,
    CallOptions,
    HistoryTurn,
    PlaybackPosition,
    Send,
)
from voice.call.providers import OpenAIRealtime, SessionConfig, ToolSpec
from voice.call.transports.base import TurnContext


class Speaker:
    """What the shell would report: playing or not, and how much of which item went out."""

    def __init__(self) -> None:
        self.playing = False
        self.played: dict[str, int] = {}

    def position(self) -> PlaybackPosition:
        item = next(reversed(self.played), None)
        return PlaybackPosition(self.playing, item, self.played.get(item, 0) if item else 0)


class Driven:
    """The core as the shell drives it: every entry point gets `now` and the speaker's position."""

    def __init__(self, core: CallCore, speaker: Speaker) -> None:
        self.core, self.speaker = core, speaker

    def __getattr__(self, name):
        return getattr(self.core, name)

    def on_provider(self, event, now: float = 0.0):
        return self.core.on_provider(event, now, self.speaker.position())

    def on_user_audio(self, frame: bytes, now: float = 0.0, context: TurnContext | None = None):
        return self.core.on_user_audio(frame, now, self.speaker.position(), context)

    def on_tool_result(self, call_id: str, output: str, now: float = 0.0):
        return self.core.on_tool_result(call_id, output, now, self.speaker.position())

    def announce(self, announcement_id: int, text: str, now: float = 0.0):
        return self.core.announce(announcement_id, text, now, self.speaker.position())

    def on_reconnected(self, now: float = 0.0):
        return self.core.on_reconnected(now, self.speaker.position())

    def on_disconnect(self, now: float = 0.0):
        return self.core.on_disconnect(now)

    def end(self, now: float = 0.0):
        return self.core.end(now)

    def tick(self, now: float):
        return self.core.tick(now, self.speaker.position())

    def on_playback_idle(self, now: float = 0.0):
        return self.core.on_playback_idle(now, self.speaker.position())

    def on_next_session_open(self, now: float = 0.0):
        return self.core.on_next_session_open(now, self.speaker.position())

    def on_next_session_ready(self, now: float = 0.0):
        return self.core.on_next_session_ready(now, self.speaker.position())


def make_core(endpointing: str = "server", *, history: Sequence[HistoryTurn] = (), **options) -> tuple[Driven, Speaker]:
    """A started core (at time 0); `options` are further `CallOptions`."""
    speaker = Speaker()
    provider = OpenAIRealtime("k", "gpt-realtime-2.1-mini", "marin")
    session = SessionConfig("be brief", "marin", (ToolSpec("t", "d", {"type": "object", "properties": {}}),))
    core = CallCore(provider, session, CallOptions(endpointing=endpointing, **options), history=history)
    sent(core.start(0.0))
    return Driven(core, speaker), speaker


def sent(actions) -> list[dict]:
    events = [a.event for a in actions if isinstance(a, Send)]
    for event in events:
        validate_client_event(event)
    return events


def types(actions) -> list[str]:
    return [e["type"] for e in sent(actions)]


LOUD = (np.sin(np.arange(480) / 3) * 8000).astype("<i2").tobytes()
QUIET = bytes(960)
ALICE, BOB = 111111111111111111, 222222222222222222


def speak(core, frames: list[tuple[bytes, TurnContext | None]], start: float = 0.0) -> list:
    out = []
    for i, (frame, who) in enumerate(frames):
        out += core.on_user_audio(frame, start + i * 0.02, who)
    return out


def turn_of(*speakers: int, loud: int = 10, quiet: int = 26, names: dict | None = None):
    who = TurnContext(frozenset(speakers), names or {})
    return [(LOUD, who)] * loud + [(QUIET, None)] * quiet


