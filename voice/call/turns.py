"""The turns of one call: who is in the audio not yet committed, and each turn's latency record.

Pure bookkeeping for `CallCore`. Frames are heard (`hear`) with the speakers the transport says are
in them; a commit takes exactly those speakers (`commit`) and starts the next turn from nobody.
Finished records wait in `drain()` for the core to hand them to its shell.
"""

from __future__ import annotations

import itertools

from voice.call.attribution import Attribution
from voice.call.transports.base import TurnContext
from voice.call.turn_record import TurnRecord


class TurnLedger:
    def __init__(self) -> None:
        self.current: TurnRecord | None = None
        self._ids = itertools.count(1)
        self._unheard: list[TurnRecord] = []  # answered, but not one frame played yet
        self._finished: list[TurnRecord] = []  # not yet handed to the shell
        self._heard: set[int] = set()  # speakers of the audio appended since the last commit
        self._names: dict[int, str] = {}

    # -- who is in the buffer ------------------------------------------------------------------

    def hear(self, context: TurnContext | None) -> None:
        """A frame was appended to the provider's input buffer; these people are in it."""
        if context is None or not context.speakers:
            return
        self._heard.update(context.speakers)
        for user_id in context.speakers:
            name = context.names.get(user_id)
            if name:
                self._names[user_id] = name

    def forget_heard(self) -> None:
        """The input buffer is gone (the socket dropped): so is who was in it."""
        self._heard.clear()
        self._names.clear()

    def commit(self, turn: TurnRecord) -> tuple[Attribution, dict[int, str]]:
        """The buffer was committed as `turn`: its speakers (and display names), then nobody."""
        speakers = frozenset(self._heard)
        names = {k: v for k, v in self._names.items() if k in speakers}
        self.forget_heard()
        turn.speakers = sorted(speakers)
        return Attribution(None, turn.turn, speakers or None), names

    # -- records ---------------------------------------------------------------------------------

    def new(self, now: float) -> TurnRecord:
        if self.current is not None:
            self.close(self.current.status or "superseded")
        self.flush_unheard()
        self.current = TurnRecord(next(self._ids), speech_end=now)
        return self.current

    def close(self, status: str) -> None:
        turn = self.current
        if turn is None:
            return
        turn.status = turn.status or status
        self.current = None
        if turn.first_audio_delta is not None and turn.first_audio_played is None and status != "ended":
            self._unheard.append(turn)  # recorded once its first frame plays (or the next turn)
        else:
            self._finished.append(turn)

    def first_played(self, turn: TurnRecord, now: float) -> None:
        if turn.first_audio_played is None:
            turn.first_audio_played = now
            if turn in self._unheard:
                self._unheard.remove(turn)
                self._finished.append(turn)

    def flush_unheard(self) -> None:
        self._finished.extend(self._unheard)
        self._unheard.clear()

    def drain(self) -> list[TurnRecord]:
        finished, self._finished = self._finished, []
        return finished
