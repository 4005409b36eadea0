"""The interface between the call engine and whatever carries its audio.

All audio here is 24 kHz mono s16le (the model's format); a transport converts at its edges.
The engine calls every method on the event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

RATE = 24_000
FRAME_MS = 20
FRAME_BYTES = RATE * 2 * FRAME_MS // 1000  # 960


@dataclass(frozen=True)
class TurnContext:
    """Who spoke the turn about to be committed (local endpointing).

    `context` is inserted as a conversation item just before the audio; `metadata` (≤16 string
    pairs) rides on `response.create` and comes back with the response's function calls.
    """

    context: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)


class CallTransport(Protocol):
    def frames(self) -> AsyncIterator[bytes]:
        """User audio in real time, FRAME_BYTES per frame; ends when the input ends."""
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

    def played_ms(self, item_id: str) -> int:
        """Milliseconds of `item_id` actually played so far."""
        ...

    def is_playing(self) -> bool:
        ...

    def set_listener(self, listener: PlaybackListener) -> None:
        """Register who hears about playback starting per item and the speaker going idle."""
        ...

    def turn_context(self) -> TurnContext | None:
        """Speaker context for the turn being committed (None for a single local speaker)."""
        ...


class PlaybackListener(Protocol):
    def on_playback_started(self, item_id: str) -> None: ...
    def on_playback_idle(self) -> None: ...


NowFn = Callable[[], float]
