"""The interface between the call engine and whatever carries its audio.

All audio here is 24 kHz mono s16le (the model's format); a transport converts at its edges.
The engine calls every method on the event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from voice.call.actions import PlaybackPosition

RATE = 24_000
FRAME_MS = 20
FRAME_BYTES = RATE * 2 * FRAME_MS // 1000  # 960


@dataclass(frozen=True)
class TurnContext:
    """Who spoke the PCM frame just yielded by `frames()` (a terminal, a file): immutable user ids and
    display names. Exactly one id makes that person the turn's speaker; none or several make the
    speaker unknown, and tools that change things refuse (a room yields `RoomTick`s instead: every
    member on their own). `names` are display names, passed to the model as quoted untrusted data and
    never used to authorise anything; a transport that gives none gets no speaker-context item.
    """

    speakers: frozenset[int] = frozenset()
    names: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HeardFrame:
    """One member's 20 ms of audio (24 kHz mono s16le) and the speech probability their VAD gave it."""

    pcm: bytes
    probability: float


@dataclass(frozen=True)
class RoomTick:
    """20 ms of a room: each member who sent audio, on their own (never mixed), keyed by immutable id.

    `names` are display names (untrusted: quoted to the model as data, never used to authorise)."""

    frames: Mapping[int, HeardFrame]
    names: Mapping[int, str] = field(default_factory=dict)


class CallTransport(Protocol):
    def frames(self) -> AsyncIterator[bytes | RoomTick]:
        """User audio in real time, one 20 ms tick per item; ends when the input ends.

        One local speaker yields FRAME_BYTES of PCM per tick (the call core runs the VAD); a room
        yields a `RoomTick` with each member's own frame and speech probability."""
        ...

    def play(self, pcm: bytes, item_id: str) -> None:
        """Queue assistant audio of `item_id` for playback."""
        ...

    def finish_item(self, item_id: str) -> None:
        """All audio of `item_id` has been queued."""
        ...

    def clear(self) -> None:
        """Barge-in: stop at once and drop everything not yet played."""
        ...

    def pause(self) -> None:
        """Hold playback where it is (silence goes out; nothing queued is dropped)."""
        ...

    def resume(self) -> None:
        """Play on from where `pause` held it."""
        ...

    def played_ms(self, item_id: str) -> int:
        """Milliseconds of `item_id` actually played so far."""
        ...

    def is_playing(self) -> bool:
        ...

    def set_listener(self, listener: PlaybackListener) -> None:
        """Register who hears about playback starting per item and the speaker going idle."""
        ...

    def turn_context(self) -> TurnContext | None:
        """Who spoke the frame `frames()` yielded last (None: nobody known)."""
        ...

    def position(self) -> PlaybackPosition:
        """What the speaker has handed to the output so far (read by the shell, passed to the core)."""
        ...


class PlaybackListener(Protocol):
    def on_playback_started(self, item_id: str) -> None: ...
    def on_playback_idle(self) -> None: ...


NowFn = Callable[[], float]
