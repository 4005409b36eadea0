"""A small OpenAI-compatible chat-completions model for a real Hermes gateway to think with.

    with FakeAgentModel() as model:             # its own thread and event loop: it outlives any test's loop
        config = model.url                      # http://127.0.0.1:PORT/v1, for Hermes's config.yaml
        model.release("slow-1")                 # let a "[hold:slow-1]" task answer

What it answers is decided by markers in the task (the last user message), so many runs can share one
gateway and each test drives its own:

- `[long:N]`: a final answer of exactly N characters (`long_answer(N)`);
- `[hold:NAME]`: no answer until `release(NAME)`; `held(NAME)` says (thread-safely) that the request came;
- `[approve:CMD]`: first a `terminal` tool call running CMD (a command Hermes asks permission for), then,
  once the tool's result comes back, `after approval: <the tool's result>`;
- anything else: `done: <task>`.

Requests with `"stream": true` are answered as chat.completion.chunk server-sent events ending in
`data: [DONE]`, the others as one `chat.completion`; both as the OpenAI API shapes them.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from concurrent.futures import Future
from typing import Any

from aiohttp import web

MODEL = "fake-agent-model"
_HOLD = re.compile(r"\[hold:([\w-]+)\]")
_LONG = re.compile(r"\[long:(\d+)\]")
_APPROVE = re.compile(r"\[approve:([^\]]+)\]")


def long_answer(chars: int) -> str:
    """A deterministic answer of exactly `chars` characters (numbered words, so a cut shows)."""
    words, total, n = [], 0, 0
    while total < chars:
        word = f"w{n} "
        words.append(word)
        total += len(word)
        n += 1
    text = "".join(words)[:chars]
    return text[:-1] + "." if text.endswith(" ") else text  # Hermes strips a trailing space


def _task(body: dict) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def _tool_result(body: dict) -> str | None:
    messages = body.get("messages") or []
    if messages and messages[-1].get("role") == "tool":
        return str(messages[-1].get("content") or "")
    return None


class FakeAgentModel:
    def __init__(self) -> None:
        self.url = ""
        self.requests: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._holds: dict[str, asyncio.Event] = {}
        self._arrived: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-agent-model", daemon=True)
        self._runner: web.AppRunner | None = None

    # -- lifecycle (from the test's thread) ----------------------------------------------------------

    def __enter__(self) -> FakeAgentModel:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in list(self._holds):
            self.release(name)
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}/v1"

    async def _stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    # -- test controls (thread-safe) -----------------------------------------------------------------

    def _arrival(self, name: str) -> Future:
        with self._lock:
            return self._arrived.setdefault(name, Future())

    def held(self, name: str) -> asyncio.Future:
        """Awaitable in any event loop: done once a `[hold:NAME]` request has arrived."""
        return asyncio.wrap_future(self._arrival(name))

    def release(self, name: str) -> None:
        self._loop.call_soon_threadsafe(lambda: self._hold(name).set())

    def _hold(self, name: str) -> asyncio.Event:
        return self._holds.setdefault(name, asyncio.Event())

    # -- the API -------------------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0,
                                                               "owned_by": "switchboard-tests"}]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        task, result = _task(body), _tool_result(body)
        message: dict[str, Any]
        if (hold := _HOLD.search(task)) and result is None:
            future = self._arrival(hold.group(1))
            if not future.done():
                future.set_result(True)
            await self._hold(hold.group(1)).wait()
        if (approve := _APPROVE.search(task)) and result is None:
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{len(self.requests)}", "type": "function",
                "function": {"name": "terminal", "arguments": json.dumps({"command": approve.group(1)})}}]}
        elif approve:
            message = {"role": "assistant", "content": f"after approval: {' '.join(result.split())[:200]}"}
        elif long := _LONG.search(task):
            message = {"role": "assistant", "content": long_answer(int(long.group(1)))}
        else:
            message = {"role": "assistant", "content": f"done: {task}"}
        if body.get("stream"):
            return await self._stream(request, message)
        return web.json_response(self._completion(message))

    def _completion(self, message: dict) -> dict:
        reason = "tool_calls" if message.get("tool_calls") else "stop"
        return {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
                "model": MODEL, "choices": [{"index": 0, "message": message, "finish_reason": reason,
                                             "logprobs": None}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

    async def _stream(self, request: web.Request, message: dict) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        base = {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": MODEL}

        async def send(delta: dict, reason: str | None = None, usage: dict | None = None) -> None:
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}]}
            if usage is not None:
                chunk["usage"] = usage
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        await send({"role": "assistant", "content": ""})
        if message.get("tool_calls"):
            calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
            await send({"tool_calls": calls})
            await send({}, "tool_calls", {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
        else:
            text = message["content"]
            for start in range(0, len(text), 4000):
                await send({"content": text[start:start + 4000]})
            await send({}, "stop", {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
        await response.write(b"data: [DONE]\n\n")
        return response
