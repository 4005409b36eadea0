"""Where finished runs go: live calls (spoken) and a notification sink (a channel, the terminal)."""

from __future__ import annotations

import sys
from typing import Protocol, TextIO

from runs.core import RunTicket
from runs.wording import STATE_WORDS, bounded, elapsed_words


class Announcer(Protocol):
    """A live call that can say something unprompted (e.g. `voice.call.engine.CallEngine`).

    `announce` returns True once spoken, False when the call ended (or could not) before speaking.
    """

    async def announce(self, text: str) -> bool: ...


class NotificationSink(Protocol):
    """Receives every finished run once (e.g. an embed in the runs channel; the terminal prints it)."""

    async def post_run(self, ticket: RunTicket) -> None: ...


class NullSink:
    async def post_run(self, ticket: RunTicket) -> None:
        return None


class TerminalSink:
    """`switchboard talk`: print a finished run to stderr (the output bounded)."""

    def __init__(self, stream: TextIO | None = None, output_chars: int = 2000) -> None:
        self._stream = stream
        self._output_chars = output_chars

    async def post_run(self, ticket: RunTicket) -> None:
        stream = self._stream or sys.stderr
        took = elapsed_words(ticket.elapsed(ticket.finished_at or ticket.updated_at))
        print(f"\n── run {ticket.id} {STATE_WORDS[ticket.state]} on {ticket.lane} after {took}: "
              f"{bounded(ticket.task, 80)}", file=stream)
        if ticket.error:
            print(f"   error: {ticket.error}", file=stream)
        if ticket.output:
            text = ticket.output if len(ticket.output) <= self._output_chars else (
                ticket.output[: self._output_chars] + f"\n   … (`switchboard runs show {ticket.id}` has the rest)")
            print(text, file=stream)
        stream.flush()
