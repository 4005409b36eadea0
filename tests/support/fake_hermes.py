"""Fake Hermes Agent api_server on loopback (aiohttp) for the runs tests.

    async with FakeHermes(key="k") as fake:
        lane = HermesApiLane(RunsConfig(hermes_url=fake.url, hermes_key="k"))
        ...
        fake.progress(run_id, "web_search", "auth module")
        fake.complete(run_id, "three gaps found")
        fake.assert_clean()

It speaks the real shapes (`/v1/capabilities`, `POST /v1/runs` → 202, `GET /v1/runs/{id}`,
`/events` as server-sent events carrying `{"event": name, "run_id", "timestamp", …}` frames and
`: keepalive` comments, `/approval`, `/stop`) as hermes-agent 0.19.0's api_server does (the shapes
both share are checked by one script run against both: `tests/test_fake_hermes_agrees.py`), and is as
strict as it where a client bug would show: a missing or wrong bearer is 401, a body without `input` or
with bad JSON is 400, an approval choice outside once/session/always/deny is 400, answering when
nothing is pending is 409, stopping a run that has ended is 404. Like the real one it ignores
`Idempotency-Key` (the same key twice starts two runs), its `waiting_for_approval` status carries no
approval object, its approval events carry no request id, and a run's events go to one queue: a second
subscriber, after the first is gone, gets 404. Every rejected request is also recorded in
`violations`, so `assert_clean()` fails a test whose client sent one — unless the test expected it
(`expect_violation`).

Beyond the real server, only when a test asks for it (`features=STEER_FEATURES`): `/steer`, for the
steering receipts of a Hermes that offers it (0.19.0 does not): steering a run that is not `running`
is 409; `pending_steer` is reported in the run status from the moment a note is
accepted until `consume_steer()` (the real one reports leftovers only at the end), so tests can
drive the receipt states; the test decides every step of a run (nothing advances on its own except
a stop settling to `cancelled`, which `settle_stop=False` turns off).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

TERMINAL = {"completed", "failed", "cancelled", "interrupted"}
CHOICE_ALIASES = {"approve": "once", "approved": "once", "allow": "once"}

# hermes-agent 0.19.0's run features, as its /v1/capabilities lists them
DEFAULT_FEATURES = {
    "chat_completions": True,
    "responses_api": True,
    "run_submission": True,
    "run_status": True,
    "run_events_sse": True,
    "run_stop": True,
    "run_approval_response": True,
    "tool_progress_events": True,
    "approval_events": True,
}
STEER_FEATURES = {**DEFAULT_FEATURES, "run_steer": True}  # a Hermes that offers steering (not 0.19.0)

_DROP = object()
_CLOSE = object()


def _error(message: str, *, status: int, code: str | None = None,
           err_type: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": err_type, "param": None, "code": code}},
                             status=status)


@dataclass
class FakeRun:
    run_id: str
    input: Any
    body: dict
    status: str = "queued"
    output: str | None = None
    error: str | None = None
    approval: dict | None = None
    pending_steer: list[str] = field(default_factory=list)
    steers: list[str] = field(default_factory=list)
    answers: list[dict] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    last_event: str | None = None
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    stream_open: asyncio.Event = field(default_factory=asyncio.Event)
    stream_closed: asyncio.Event = field(default_factory=asyncio.Event)
    stream_used: bool = False

    def status_body(self) -> dict:
        body: dict[str, Any] = {"object": "hermes.run", "run_id": self.run_id, "status": self.status,
                                "output": self.output, "usage": None, "last_event": self.last_event,
                                "created_at": self.created_at, "updated_at": self.updated_at}
        if self.error is not None:
            body["error"] = self.error
        if self.pending_steer:
            body["pending_steer"] = "\n".join(self.pending_steer)
        return body


class FakeHermes:
    """See the module docstring. `key=None` runs without auth (the real server with no API_SERVER_KEY)."""

    def __init__(self, *, key: str | None = "test-key", features: dict | None = None,
                 settle_stop: bool = True, sse_event_field: bool = False, host: str = "127.0.0.1") -> None:
        self.key = key
        self.features = dict(DEFAULT_FEATURES if features is None else features)
        self.settle_stop = settle_stop
        self.sse_event_field = sse_event_field
        self.host = host
        self.url = ""
        self.runs: dict[str, FakeRun] = {}
        self.requests: list[dict] = []
        self.violations: list[str] = []
        self.expected_violations = 0
        self.submissions = 0
        self._ids = itertools.count(1)
        self._gate: asyncio.Event | None = None
        self.submission_held = asyncio.Event()
        self.run_created = asyncio.Event()
        self._runner: web.AppRunner | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    async def __aenter__(self) -> FakeHermes:
        app = web.Application()
        app.router.add_get("/v1/capabilities", self._capabilities)
        app.router.add_post("/v1/runs", self._submit)
        app.router.add_get("/v1/runs/{run_id}", self._status)
        app.router.add_get("/v1/runs/{run_id}/events", self._events)
        if self.features.get("run_steer"):
            app.router.add_post("/v1/runs/{run_id}/steer", self._steer)
        app.router.add_post("/v1/runs/{run_id}/approval", self._approval)
        app.router.add_post("/v1/runs/{run_id}/stop", self._stop)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.host}:{port}"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for run in self.runs.values():
            run.queue.put_nowait(_CLOSE)
        if self._gate is not None:
            self._gate.set()
        assert self._runner is not None
        await self._runner.cleanup()

    def assert_clean(self) -> None:
        unexpected = self.violations[self.expected_violations:]
        assert not unexpected, f"the client sent requests the real server would reject: {unexpected}"

    def expect_violation(self) -> None:
        """The next rejected request is what the test wants (e.g. a wrong key)."""
        self.expected_violations += 1

    # -- test controls -----------------------------------------------------------------------------

    def hold_submissions(self) -> asyncio.Event:
        """Make POST /v1/runs wait until the returned event is set (a slow lane)."""
        self._gate = asyncio.Event()
        return self._gate

    def only_run(self) -> FakeRun:
        assert len(self.runs) == 1, f"expected one run, have {list(self.runs)}"
        return next(iter(self.runs.values()))

    def emit(self, run_id: str, name: str, **fields: Any) -> None:
        run = self.runs[run_id]
        run.last_event = name
        run.updated_at = time.time()
        run.queue.put_nowait({"event": name, "run_id": run_id, "timestamp": time.time(), **fields})

    def keepalive(self, run_id: str) -> None:
        self.runs[run_id].queue.put_nowait(b": keepalive\n\n")

    def progress(self, run_id: str, tool: str = "web_search", preview: str = "looking") -> None:
        self.emit(run_id, "tool.started", tool=tool, preview=preview)

    def request_approval(self, run_id: str, *, description: str = "run `rm -rf build/`",
                         choices: tuple[str, ...] = ("once", "session", "always", "deny")) -> str:
        run = self.runs[run_id]
        run.approval = {"command": description, "description": description, "choices": list(choices)}
        run.status = "waiting_for_approval"
        self.emit(run_id, "approval.request", command=description, pattern_key=description,
                  pattern_keys=[description], description=description, allow_permanent="always" in choices,
                  choices=list(choices))
        return None

    def consume_steer(self, run_id: str) -> None:
        """The agent drains its notes after a step: they leave pending_steer, and a new event follows."""
        run = self.runs[run_id]
        run.pending_steer.clear()
        self.emit(run_id, "tool.started", tool="read_file", preview="following the note")

    def complete(self, run_id: str, output: str = "done", *, leave_pending: bool = False) -> None:
        run = self.runs[run_id]
        run.status, run.output = "completed", output
        if not leave_pending:
            run.pending_steer.clear()
        self.emit(run_id, "run.completed", output=output, usage={"input_tokens": 1, "output_tokens": 1,
                                                                 "total_tokens": 2})
        run.queue.put_nowait(_CLOSE)

    def fail(self, run_id: str, error: str = "the model refused") -> None:
        run = self.runs[run_id]
        run.status, run.error = "failed", error
        self.emit(run_id, "run.failed", error=error)
        run.queue.put_nowait(_CLOSE)

    def cancel(self, run_id: str) -> None:
        run = self.runs[run_id]
        run.status = "cancelled"
        self.emit(run_id, "run.cancelled")
        run.queue.put_nowait(_CLOSE)

    def set_status(self, run_id: str, status: str, **fields: Any) -> None:
        """Change the pollable status without any event (e.g. what happened while nobody listened)."""
        run = self.runs[run_id]
        run.status = status
        for key, value in fields.items():
            setattr(run, key, value)

    def drop_stream(self, run_id: str) -> None:
        """Cut the event stream mid-run (no terminal event, no clean end of the chunked body)."""
        self.runs[run_id].queue.put_nowait(_DROP)

    # -- checks ------------------------------------------------------------------------------------

    def _reject(self, message: str, *, status: int, code: str | None = None) -> web.Response:
        self.violations.append(f"{status} {code or ''}: {message}")
        return _error(message, status=status, code=code)

    def _record(self, request: web.Request, body: Any = None) -> None:
        self.requests.append({"method": request.method, "path": request.path,
                              "authorization": request.headers.get("Authorization"),
                              "idempotency_key": request.headers.get("Idempotency-Key"), "body": body})

    def _auth(self, request: web.Request) -> web.Response | None:
        if self.key is None:
            return None
        header = request.headers.get("Authorization", "")
        if header != f"Bearer {self.key}":
            why = "Missing Authorization header" if not header else "Invalid API key"
            return self._reject(why, status=401, code="invalid_api_key")
        return None

    async def _json(self, request: web.Request) -> tuple[Any, web.Response | None]:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return None, self._reject("Invalid JSON", status=400)
        if not isinstance(body, dict):
            return None, self._reject("Request body must be a JSON object", status=400)
        return body, None

    def _run(self, request: web.Request) -> tuple[FakeRun | None, web.Response | None]:
        run_id = request.match_info["run_id"]
        run = self.runs.get(run_id)
        if run is None:
            return None, self._reject(f"Run not found: {run_id}", status=404, code="run_not_found")
        return run, None

    # -- handlers ----------------------------------------------------------------------------------

    async def _capabilities(self, request: web.Request) -> web.Response:
        self._record(request)
        if (denied := self._auth(request)) is not None:
            return denied
        return web.json_response({
            "object": "hermes.api_server.capabilities", "platform": "hermes-agent", "model": "hermes-agent",
            "auth": {"type": "bearer", "required": self.key is not None},
            "features": self.features,
            "endpoints": {
                "runs": {"method": "POST", "path": "/v1/runs"},
                "run_status": {"method": "GET", "path": "/v1/runs/{run_id}"},
                "run_events": {"method": "GET", "path": "/v1/runs/{run_id}/events"},
                "run_approval": {"method": "POST", "path": "/v1/runs/{run_id}/approval"},
                "run_stop": {"method": "POST", "path": "/v1/runs/{run_id}/stop"},
            },
        })

    async def _submit(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            self._record(request)
            return denied
        body, bad = await self._json(request)
        self._record(request, body)
        if bad is not None:
            return bad
        raw = body.get("input")
        if not raw:
            return self._reject("Missing 'input' field", status=400)
        if not isinstance(raw, (str, list)):
            return self._reject("No user message found in input", status=400)
        if self._gate is not None:
            self.submission_held.set()
            await self._gate.wait()
        run_id = f"run_{next(self._ids):032x}"
        run = FakeRun(run_id, raw, body)
        self.runs[run_id] = run
        self.submissions += 1
        run.status = "running"
        self.run_created.set()
        return web.json_response({"run_id": run_id, "status": "started"}, status=202)

    async def _status(self, request: web.Request) -> web.Response:
        self._record(request)
        if (denied := self._auth(request)) is not None:
            return denied
        run, missing = self._run(request)
        if missing is not None:
            return missing
        return web.json_response(run.status_body())

    async def _events(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        if (denied := self._auth(request)) is not None:
            return denied
        run, missing = self._run(request)
        if missing is not None:
            return missing
        if run.stream_used:  # one consumer, not resumable: the transport is gone after a disconnect
            return _error(f"Run not found: {run.run_id}", status=404, code="run_not_found")
        run.stream_used = True
        response = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await response.prepare(request)
        await response.write(b": keepalive\n\n")
        run.stream_open.set()
        try:
            while True:
                item = await run.queue.get()
                if item is _DROP:
                    assert request.transport is not None
                    request.transport.abort()
                    return response
                if item is _CLOSE:
                    await response.write(b": stream closed\n\n")
                    break
                if isinstance(item, bytes):
                    await response.write(item)
                    continue
                frame = f"data: {json.dumps(item)}\n\n"
                if self.sse_event_field:
                    frame = f"event: {item['event']}\n" + frame
                await response.write(frame.encode())
        except ConnectionResetError:  # the client went away (e.g. a service instance was dropped)
            pass
        finally:
            run.stream_closed.set()
        return response

    async def _steer(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            self._record(request)
            return denied
        run, missing = self._run(request)
        if missing is not None:
            self._record(request)
            return missing
        if run.status != "running":
            self._record(request)
            return self._reject(f"Run is not currently accepting steer input: {run.run_id}", status=409,
                                code="run_not_accepting_steer")
        body, bad = await self._json(request)
        self._record(request, body)
        if bad is not None:
            return bad
        text = body.get("input") or body.get("message") or body.get("text") or ""
        if not isinstance(text, str) or not text.strip():
            return self._reject("Missing non-empty steer text; expected 'input', 'message', or 'text'.",
                                status=400, code="invalid_steer_input")
        run.steers.append(text.strip())
        run.pending_steer.append(text.strip())
        self.emit(run.run_id, "run.steered", accepted=True)
        return web.json_response({"object": "hermes.run.steer", "run_id": run.run_id, "accepted": True})

    async def _approval(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            self._record(request)
            return denied
        run, missing = self._run(request)
        if missing is not None:
            self._record(request)
            return missing
        body, bad = await self._json(request)
        self._record(request, body)
        if bad is not None:
            return bad
        raw_choice = str(body.get("choice", "")).strip().lower()
        choice = CHOICE_ALIASES.get(raw_choice, raw_choice)
        if choice not in {"once", "session", "always", "deny"}:
            return self._reject("Invalid approval choice; expected one of: once, session, always, deny",
                                status=400, code="invalid_approval_choice")
        if run.status in TERMINAL:
            return self._reject(f"Run has no active approval session: {run.run_id}", status=409,
                                code="approval_not_active")
        if run.approval is None or run.status != "waiting_for_approval":
            return self._reject(f"Run has no pending approval: {run.run_id}", status=409,
                                code="approval_not_pending")
        run.answers.append({"choice": choice})
        run.approval = None
        run.status = "running"
        self.emit(run.run_id, "approval.responded", choice=choice, resolved=1)
        return web.json_response({"object": "hermes.run.approval_response", "run_id": run.run_id,
                                  "choice": choice, "resolved": 1})

    async def _stop(self, request: web.Request) -> web.Response:
        self._record(request)
        if (denied := self._auth(request)) is not None:
            return denied
        run, missing = self._run(request)
        if missing is not None:
            return missing
        if run.status in TERMINAL:  # the real server forgets a run's agent once it ends
            return _error(f"Run not found: {run.run_id}", status=404, code="run_not_found")
        run.status = "stopping"
        run.last_event = "run.stopping"
        if self.settle_stop:
            asyncio.get_running_loop().call_soon(self._settle_stop, run.run_id)
        return web.json_response({"run_id": run.run_id, "status": "stopping"})

    def _settle_stop(self, run_id: str) -> None:
        if self.runs[run_id].status == "stopping":
            self.runs[run_id].pending_steer.clear()  # stopping drops unread notes
            self.cancel(run_id)
