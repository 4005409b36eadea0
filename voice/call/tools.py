"""The tool catalogue: what the model may call, who may run it, how each call runs, what it answers.

Every call ends in exactly one output string — a result, or a short error the assistant can say —
never a stack trace. Handlers run off the audio path (the engine runs them as tasks).

Authorisation is fail-closed. A tool that changes things (`mutating=True`) runs only when
  1. the call's origin is known (the core traced it to a committed turn and its speakers), and
  2. the catalogue's authoriser allows it — and a catalogue built without one denies them all.
Every decision, allowed or refused, goes to the catalogue's decision hook (the engine logs it).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from voice.call.attribution import NO_CALL, UNKNOWN, Attribution, CallInfo
from voice.call.providers.base import ToolSpec

log = logging.getLogger(__name__)

UNKNOWN_ORIGIN_REFUSAL = ("I can't tell who asked for that, so I won't run it. Ask me again in your "
                          "own words and I'll try.")


@dataclass(frozen=True)
class ToolCall:
    """One function call from the model: its arguments, and where it came from.

    `origin` is the core's attribution (response, turn, speakers); `call` says which call (and, in
    Discord, which guild and channel). Arguments are model output: they never authorise anything.
    """

    call_id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str
    origin: Attribution = UNKNOWN
    call: CallInfo = NO_CALL

    @property
    def speakers(self) -> frozenset[int] | None:
        """Immutable user ids of who spoke the turn behind this call; None when unknown."""
        return self.origin.speakers


Handler = Callable[[ToolCall], Awaitable[Any] | Any]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    handler: Handler
    mutating: bool = False
    timeout_s: float = 20.0

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)


class ToolRefused(Exception):
    """An authoriser's refusal. Its message is spoken to the people in the call: say what to do."""


class ToolAuthorizer(Protocol):
    """Decides whether a mutating call may run: return to allow, raise `ToolRefused` to refuse.

    Async, and given the whole call (origin, speakers, call id, guild/channel) — like a discord.py
    `app_commands.check`. Only consulted for mutating tools whose origin is known.
    """

    async def authorize(self, tool: Tool, call: ToolCall) -> None: ...


class DenyMutating:
    """The default: nobody may run tools that change things (a composition must choose a gate)."""

    async def authorize(self, tool: Tool, call: ToolCall) -> None:
        raise ToolRefused(f"{tool.name} changes things, and this call has no one allowed to run such tools")


class AllowKnownSpeakers:
    """The terminal's authoriser: the one local user may run everything they asked for themselves."""

    async def authorize(self, tool: Tool, call: ToolCall) -> None:
        return None


@dataclass(frozen=True)
class ToolDecision:
    """One authorisation decision, for the log now and the store later."""

    call: CallInfo
    tool: str
    call_id: str
    origin: Attribution
    allowed: bool
    reason: str

    def describe(self) -> str:
        verdict = "allowed" if self.allowed else "refused"
        return (f"tool {self.tool} ({self.call_id}) {verdict} for {self.origin.describe()}, turn "
                f"{self.origin.turn_id}, response {self.origin.response_id}: {self.reason}")


@dataclass(frozen=True)
class ToolOutcome:
    output: str
    ok: bool
    elapsed_ms: float


DecisionHook = Callable[[ToolDecision], None]


class ToolCatalogue:
    """The tools of one call. Build one per call (`extended()` copies); nothing here is shared state."""

    def __init__(self, authorizer: ToolAuthorizer | None = None, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self.authorizer: ToolAuthorizer = authorizer or DenyMutating()
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def extended(self, *tools: Tool) -> ToolCatalogue:
        """A new catalogue with these tools and the same authoriser; this one is left as it was."""
        return ToolCatalogue(self.authorizer, [*self._tools.values(), *tools])

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(t.spec() for t in self._tools.values())

    async def run(self, call_id: str, name: str, raw_arguments: str, *,
                  origin: Attribution = UNKNOWN, call: CallInfo | None = None,
                  on_decision: DecisionHook | None = None,
                  clock: Callable[[], float] = time.monotonic,
                  logger: logging.Logger | logging.LoggerAdapter | None = None) -> ToolOutcome:
        """Run one call to completion. Never raises (cancellation aside). `logger`: the call's own
        (its lines carry the call id)."""
        logger = logger or log
        start = clock()

        def done(output: str, ok: bool) -> ToolOutcome:
            return ToolOutcome(output, ok, (clock() - start) * 1000)

        tool = self._tools.get(name)
        if tool is None:
            return done(_error(f"there is no tool called {name!r}"), False)
        try:
            arguments = json.loads(raw_arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            return done(_error(f"the arguments for {name} were not valid JSON ({exc})"), False)
        request = ToolCall(call_id, name, arguments, raw_arguments, origin, call or NO_CALL)
        if tool.mutating:
            refusal = await self._authorize(tool, request, logger)
            if on_decision is not None:
                on_decision(ToolDecision(request.call, name, call_id, origin, refusal is None,
                                         refusal or "authorised"))
            if refusal is not None:
                return done(_error(refusal), False)
        try:
            result = tool.handler(request)
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(result, tool.timeout_s)
        except TimeoutError:
            logger.warning("tool %s timed out after %.1f s", name, tool.timeout_s)
            return done(_error(f"{name} did not finish within {tool.timeout_s:g} seconds"), False)
        except Exception as exc:  # the call must be answered, not crash
            logger.exception("tool %s failed", name)
            return done(_error(f"{name} failed: {type(exc).__name__}: {exc}"[:300]), False)
        return done(result if isinstance(result, str) else json.dumps(result, default=str), True)

    async def _authorize(self, tool: Tool, call: ToolCall,
                         logger: logging.Logger | logging.LoggerAdapter) -> str | None:
        """None to allow, else the refusal to speak. Unknown origin never reaches the authoriser."""
        if not call.origin.known:
            return UNKNOWN_ORIGIN_REFUSAL
        try:
            await self.authorizer.authorize(tool, call)
        except ToolRefused as exc:
            return str(exc) or f"{tool.name} is not allowed here"
        except Exception as exc:  # a broken gate refuses; it never lets a call through
            logger.exception("authoriser failed for %s", tool.name)
            return f"{tool.name} could not be authorised ({type(exc).__name__}), so it did not run"
        return None


def _error(message: str) -> str:
    return json.dumps({"error": message})
