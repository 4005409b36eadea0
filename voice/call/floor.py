"""Who speaks next: the responses we want, the ones we asked for, and queued announcements.

Pure bookkeeping for `CallCore`. A wanted response waits until nothing else holds the floor; an
announcement waits, in addition, until nobody is speaking, the assistant is silent and the server
is not about to answer a turn of its own. Every request carries our id in `response.metadata` and
in its event id, so a `response.created` or an `error` can be matched to exactly one request.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from dataclasses import dataclass

from voice.call.attribution import UNKNOWN, Attribution
from voice.call.providers.base import ResponseRequest
from voice.call.turn_record import TurnRecord

REQUEST_KEY = "sb_req"  # our correlation id on every response.create we send
EVENT_ID_PREFIX = "sb_"
ANNOUNCE_ATTEMPTS = 2


@dataclass
class Announcement:
    announcement_id: int  # 0 = the engine's own notice (nobody awaits its result)
    text: str
    attempts: int = 0


@dataclass
class WantedResponse:
    """A response.create we want, or have sent and not yet seen created."""

    request_id: str
    kind: str  # turn | tool | announce
    request: ResponseRequest
    announcement: Announcement | None = None
    turn: TurnRecord | None = None
    cancel_on_create: bool = False
    answers: tuple[str, ...] = ()  # call ids a tool follow-up answers
    origin: Attribution = UNKNOWN  # the turn (and its speakers) this response answers

    @property
    def event_id(self) -> str:
        return EVENT_ID_PREFIX + self.request_id


class Floor:
    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.queue: deque[WantedResponse] = deque()  # wanted, not yet sent
        self.inflight: deque[WantedResponse] = deque()  # sent, not yet created
        self.announcements: deque[Announcement] = deque()
        self.hold_announcements_until = 0.0

    def want(self, kind: str, request: ResponseRequest | None = None, *,
             announcement: Announcement | None = None, turn: TurnRecord | None = None,
             answers: tuple[str, ...] = (), origin: Attribution = UNKNOWN) -> None:
        """Queue a response.create. Its metadata carries only our opaque request id: attribution is
        kept here, never read back from what the provider echoes."""
        request_id = f"r{next(self._ids)}"
        base = request or ResponseRequest()
        stamped = ResponseRequest({REQUEST_KEY: request_id}, base.instructions, base.tools_off)
        self.queue.append(WantedResponse(request_id, kind, stamped, announcement, turn, answers=answers,
                                         origin=origin))

    def await_answer(self, until: float) -> None:
        """The server's VAD ended a turn: its own answer comes before any announcement (until `until`)."""
        self.hold_announcements_until = until

    def answer_arrived(self) -> None:
        """A response was created: the hold is over (the floor rules still apply)."""
        self.hold_announcements_until = 0.0

    def announce(self, announcement: Announcement, *, first: bool = False) -> None:
        if first:
            self.announcements.appendleft(announcement)
        else:
            self.announcements.append(announcement)

    def next_request(self, *, now: float, busy: bool, user_speaking: bool, playing: bool) -> WantedResponse | None:
        """The request to send now, if any (it moves to in-flight)."""
        if busy or self.inflight:
            return None
        if not self.queue and self.announcements and not user_speaking and not playing \
                and now >= self.hold_announcements_until:
            announcement = self.announcements.popleft()
            announcement.attempts += 1
            self.want("announce", ResponseRequest(instructions=announce_instructions(announcement.text),
                                                  tools_off=True), announcement=announcement)
        if not self.queue or (user_speaking and self.queue[0].kind != "turn"):
            return None
        request = self.queue.popleft()
        self.inflight.append(request)
        return request

    def match_created(self, metadata: dict[str, str], *, fifo: bool) -> WantedResponse | None:
        """The request a `response.created` answers; FIFO only for providers that drop metadata."""
        wanted = metadata.get(REQUEST_KEY)
        for request in self.inflight:
            if request.request_id == wanted:
                self.inflight.remove(request)
                return request
        if wanted is None and fifo and self.inflight:
            return self.inflight.popleft()
        return None

    def take_inflight(self, event_id: str | None) -> WantedResponse | None:
        """The request an `error` refers to, by the event id we stamped on it."""
        for request in self.inflight:
            if event_id and request.event_id == event_id:
                self.inflight.remove(request)
                return request
        return None

    def retry_later(self, request: WantedResponse | None) -> None:
        """The server was busy with a response of its own: ask again when the floor is free."""
        if request is not None:
            self.queue.appendleft(request)
            return
        while self.inflight:
            self.queue.appendleft(self.inflight.pop())

    def retry_announcement(self, announcement: Announcement) -> bool:
        """Put a cut-off or failed announcement back once; False when it has had its attempts."""
        if announcement.attempts >= ANNOUNCE_ATTEMPTS:
            return False
        self.announcements.appendleft(announcement)
        return True

    def interrupt_pending(self) -> None:
        """Someone started talking: turns and announcements already asked for get cancelled on arrival."""
        for request in self.inflight:
            if request.kind in ("turn", "announce"):
                request.cancel_on_create = True

    def lose_connection(self) -> None:
        """The socket dropped: requests are gone with it; announcements wait for the new one."""
        for request in reversed(self.inflight):
            if request.announcement is not None:
                self.announcements.appendleft(request.announcement)
        self.inflight.clear()
        self.queue.clear()  # tool follow-ups are rebuilt on reconnect; turns are lost with the audio

    def close(self) -> list[Announcement]:
        """The call is over: everything still waiting, for reporting as undelivered."""
        pending = list(self.announcements)
        pending += [r.announcement for r in list(self.queue) + list(self.inflight) if r.announcement]
        self.announcements.clear()
        self.queue.clear()
        self.inflight.clear()
        return pending

    def empty(self) -> bool:
        return not self.queue and not self.inflight and not self.announcements


def announce_instructions(text: str) -> str:
    return ("Say the following to the people in the call now, briefly and in your own words, "
            f"then stop. Do not call tools. The message: {json.dumps(text)}")
