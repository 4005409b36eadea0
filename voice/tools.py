"""The tool catalogue: what the model may call, how each call runs, and what it answers.

Every call ends in exactly one output string — a result, or a short error the assistant can say —
never a stack trace. Handlers run off the audio path (the engine runs them as tasks).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from voice.providers.base import ToolSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolCall:
    """One function call from the model, with the metadata of the response that produced it."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str
    metadata: dict[str, str] = field(default_factory=dict)


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


class ToolAuthorizer(Protocol):
    """Decides whether a mutating call may run; returns None to allow or a refusal to speak."""

    def check(self, tool: Tool, call: ToolCall) -> str | None: ...


class AllowAll:
    """The terminal's authoriser: the one local user may run everything."""

    def check(self, tool: Tool, call: ToolCall) -> str | None:
        return None


@dataclass(frozen=True)
class ToolOutcome:
    output: str
    ok: bool
    elapsed_ms: float


class ToolCatalogue:
    def __init__(self, authorizer: ToolAuthorizer | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        self._authorizer = authorizer or AllowAll()

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(t.spec() for t in self._tools.values())

    async def run(self, call_id: str, name: str, raw_arguments: str,
                  metadata: dict[str, str] | None = None,
                  clock: Callable[[], float] = time.monotonic) -> ToolOutcome:
        """Run one call to completion. Never raises (cancellation aside)."""
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
        call = ToolCall(call_id, name, arguments, raw_arguments, dict(metadata or {}))
        if tool.mutating:
            refusal = self._authorizer.check(tool, call)
            if refusal:
                return done(_error(refusal), False)
        try:
            result = tool.handler(call)
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(result, tool.timeout_s)
        except TimeoutError:
            log.warning("tool %s timed out after %.1f s", name, tool.timeout_s)
            return done(_error(f"{name} did not finish within {tool.timeout_s:g} seconds"), False)
        except Exception as exc:  # the call must be answered, not crash
            log.exception("tool %s failed", name)
            return done(_error(f"{name} failed: {type(exc).__name__}: {exc}"[:300]), False)
        return done(result if isinstance(result, str) else json.dumps(result, default=str), True)


def _error(message: str) -> str:
    return json.dumps({"error": message})
