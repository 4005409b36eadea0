"""What the fake saw: every REST call, gateway and voice frame, and protocol violations; tests wait on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RestCall:
    method: str
    path: str  # as requested, e.g. "/api/v10/channels/123/messages" (match with endswith)
    query: dict[str, str]
    headers: dict[str, str]
    body: Any  # parsed JSON, or None
    status: int = 0  # what the fake answered
    response: Any = None
    response_headers: dict[str, str] = field(default_factory=dict)  # beyond Content-Type (rate-limit headers)
    at: float = 0.0  # the fake's clock when the request arrived (`FakeDiscord(clock=...)`)


@dataclass
class Frame:
    """One websocket message: `direction` is "in" (from the bot) or "out" (to the bot)."""

    link: str  # "gateway" or "voice"
    direction: str
    op: int
    data: Any  # JSON "d", or the binary payload after the opcode
    event: str | None = None  # gateway dispatch name
    at: float = field(default_factory=time.monotonic)  # when the fake sent or received it (the loop's clock)


@dataclass
class Journal:
    """Append-only records; `wait_for` resolves as soon as a predicate over them holds."""

    rest: list[RestCall] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    closes: list[tuple[str, int | None]] = field(default_factory=list)  # (link, code sent by the bot)
    closed_by_fake: list[tuple[str, int]] = field(default_factory=list)  # (link, close code the fake sent)
    udp: list[tuple[int, bytes]] = field(default_factory=list)  # (ssrc, datagram) from the bot
    violations: list[str] = field(default_factory=list)
    _waiters: list[tuple[Callable[[], Any], asyncio.Future]] = field(default_factory=list)

    def changed(self) -> None:
        for predicate, future in list(self._waiters):
            if future.done():
                continue
            try:
                result = predicate()
            except Exception as exc:  # a broken predicate fails the waiting test, not the server
                future.set_exception(exc)
                continue
            if result:
                future.set_result(result)

    def violation(self, text: str) -> None:
        self.violations.append(text)
        self.changed()

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
        """Return the first truthy value of `predicate()`, re-checked on every new record."""
        result = predicate()
        if result:
            return result
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        entry = (predicate, future)
        self._waiters.append(entry)
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._waiters.remove(entry)

    def frames_of(self, link: str, direction: str, op: int | None = None) -> list[Frame]:
        return [f for f in self.frames if f.link == link and f.direction == direction
                and (op is None or f.op == op)]

    def dispatched(self, event: str) -> list[dict]:
        return [f.data for f in self.frames if f.link == "gateway" and f.event == event]
