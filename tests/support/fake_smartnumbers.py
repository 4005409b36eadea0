"""A fake Smartnumbers stream server on loopback (websockets) for the listener's stream client tests.

    async with FakeSmartnumbers(key="k1") as fake:
        client = StreamClient(fake.url, key=lambda: "k1", allowed_hosts=frozenset({"127.0.0.1"}),
                              allow_insecure_local=True, handle=handle)
        await client.start()
        await fake.wait_connection(1)                  # connection 1 has said hello
        await fake.send_event(transcript_url_event("evt_1"))
        ack = await fake.ack_for("evt_1")
        fake.assert_clean()

What it checks (violations collect in `fake.violations`; `assert_clean()` raises with them):
- the upgrade carries exactly one `Authorization: Bearer <key>` for the *current* key (`fake.key`, settable
  to test rotation) — otherwise HTTP 401 and nothing else; the key never appears in the request path;
- the client's first message on a connection is `hello` with `protocol_version` 1 and a `client` name,
  and it says hello once;
- every `transcript_ack` has the protocol's fields with the right types (`event_id`, `conversation_id`,
  `success`, `stages`, `errors` [{stage, message}], `job_id`, `job_ids`), answers an event pushed on
  *that* connection that deserves an ack, and never outnumbers that event's deliveries there;
- nothing else is sent (every client message must be JSON text of a known type).

Waiting is on a condition, never on a sleep; the timeouts only bound a failing test.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

__all__ = ["FakeSmartnumbers", "direct_transcript_event", "transcript_url_event"]

PATH = "/ws/hermes"


def transcript_url_event(event_id: str, conversation_id: str | None = None, **extra: Any) -> dict:
    """A `transcript_url` event as Smartnumbers sends it."""
    event = {
        "type": "transcript_url",
        "event_id": event_id,
        "conversation_id": conversation_id or f"call_{event_id}",
        "source": "bandwidth-call-recording",
        "metadata": {"direction": "inbound", "from": "+15550100", "to": "+15550199"},
        "url": f"https://transcripts.example.com/{event_id}.md?X-Amz-Signature=abc",
        "expires_at": "2099-01-01T00:00:00Z",
    }
    event.update(extra)
    return event


def direct_transcript_event(conversation_id: str) -> dict:
    """A direct transcript (the local-development path): no `type`, `conversation_id` and `turns`."""
    return {
        "conversation_id": conversation_id,
        "source": "test-fixture",
        "participants": {"user": "Damien", "person_x": "Alex"},
        "turns": [{"speaker": "user", "text": "Short version first, please."}],
    }


class _NoDebug(logging.LoggerAdapter):
    """websockets' server logs request headers (the key) at DEBUG; keep them out of caplog."""

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802
        return level > logging.DEBUG and self.logger.isEnabledFor(level)


def _deserves_ack(message: dict) -> bool:
    kind = message.get("type")
    return kind == "transcript_url" or (kind is None and "conversation_id" in message and "turns" in message)


def _ack_problems(ack: dict) -> list[str]:
    problems = []
    if ack.get("protocol_version") != 1 or isinstance(ack.get("protocol_version"), bool):
        problems.append(f"protocol_version is {ack.get('protocol_version')!r}, not 1")
    if not (ack.get("event_id") is None or isinstance(ack.get("event_id"), str)):
        problems.append("event_id is not a string")
    if not isinstance(ack.get("conversation_id"), str):
        problems.append("conversation_id is not a string")
    if not isinstance(ack.get("success"), bool):
        problems.append("success is not a boolean")
    if not isinstance(ack.get("stages"), dict):
        problems.append("stages is not an object")
    errors = ack.get("errors")
    if not isinstance(errors, list) or not all(
        isinstance(e, dict) and isinstance(e.get("stage"), str) and isinstance(e.get("message"), str)
        for e in errors
    ):
        problems.append("errors is not a list of {stage, message} strings")
    if "job_id" not in ack or not (ack["job_id"] is None or isinstance(ack["job_id"], str)):
        problems.append("job_id is missing or not a string/null")
    job_ids = ack.get("job_ids")
    if not isinstance(job_ids, list) or not all(isinstance(j, str) for j in job_ids):
        problems.append("job_ids is not a list of strings")
    return problems


class FakeSmartnumbers:
    """Loopback fake of the Smartnumbers stream endpoint (see the module docstring)."""

    def __init__(self, key: str | None = "test-key", *, host: str = "127.0.0.1", path: str = PATH,
                 redirect_to: str | None = None) -> None:
        self.key = key
        self.host, self.path, self.redirect_to = host, path, redirect_to
        self.url = ""
        self.attempts = 0  # upgrade requests, accepted or not
        self.rejected = 0  # answered 401
        self.connections = 0  # upgrades accepted
        self.auth_headers: list[str | None] = []  # every attempt's Authorization header
        self.received: list[tuple[int, Any]] = []  # (connection, parsed message or raw text)
        self.acks: list[tuple[int, dict]] = []  # (connection, ack)
        self.hellos: dict[int, dict] = {}
        self.closed: dict[int, tuple[int | None, str]] = {}  # connection -> (code the client sent, reason)
        self.violations: list[str] = []
        self._conns: dict[int, ServerConnection] = {}
        self._expected: dict[int, dict[Any, int]] = {}  # connection -> ack key -> deliveries
        self._acked: dict[int, dict[Any, int]] = {}
        self._ignored: dict[int, set[Any]] = {}
        self._changed = asyncio.Condition()
        self._server: Any = None

    # -- lifecycle -----------------------------------------------------------------------------------

    async def __aenter__(self) -> FakeSmartnumbers:
        self._server = await serve(self._handler, self.host, 0, process_request=self._process_request,
                                   logger=_NoDebug(logging.getLogger("tests.fake_smartnumbers"), {}))
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"ws://{self.host}:{port}{self.path}"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._server.close()
        try:
            await asyncio.wait_for(self._server.wait_closed(), 1.0)
        except (TimeoutError, asyncio.TimeoutError):
            for ws in list(self._conns.values()):
                ws.transport.abort()

    def _process_request(self, connection: ServerConnection, request: Any) -> Any:
        self.attempts += 1
        values = request.headers.get_all("Authorization")
        self.auth_headers.append(values[0] if values else None)
        if len(values) > 1:
            self.violations.append(f"attempt {self.attempts}: {len(values)} Authorization headers")
        if self.key and self.key in request.path:
            self.violations.append(f"attempt {self.attempts}: the key is in the request path")
        if request.path.split("?", 1)[0] != self.path:
            return connection.respond(404, "Not Found\n")
        if self.redirect_to:
            response = connection.respond(302, "Moved\n")
            response.headers["Location"] = self.redirect_to
            return response
        if not self.key or values != [f"Bearer {self.key}"]:
            self.rejected += 1
            self._notify_soon()
            return connection.respond(401, "Unauthorized\n")
        return None

    def _notify_soon(self) -> None:
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _handler(self, ws: ServerConnection) -> None:
        self.connections += 1
        n = self.connections
        self._conns[n] = ws
        self._expected[n], self._acked[n], self._ignored[n] = {}, {}, set()
        await self._notify()
        try:
            async for raw in ws:
                self._check(n, raw)
                await self._notify()
        except ConnectionClosed:
            pass
        finally:
            rcvd = ws.protocol.close_rcvd
            self.closed[n] = (rcvd.code, rcvd.reason) if rcvd is not None else (None, "")
            self._conns.pop(n, None)
            await self._notify()

    def _check(self, n: int, raw: str | bytes) -> None:
        if isinstance(raw, bytes):
            self.received.append((n, raw))
            self.violations.append(f"connection {n}: a binary message")
            return
        try:
            message = json.loads(raw)
        except ValueError:
            self.received.append((n, raw))
            self.violations.append(f"connection {n}: a message that is not JSON: {raw[:80]!r}")
            return
        self.received.append((n, message))
        if not isinstance(message, dict):
            self.violations.append(f"connection {n}: a JSON {type(message).__name__}, not an object")
            return
        kind = message.get("type")
        if n not in self.hellos:
            if kind != "hello":
                self.violations.append(f"connection {n}: first message is {kind!r}, not hello")
                return
            version = message.get("protocol_version")
            if version != 1 or isinstance(version, bool):
                self.violations.append(f"connection {n}: hello protocol_version is {version!r}, not 1")
            if not isinstance(message.get("client"), str) or not message["client"]:
                self.violations.append(f"connection {n}: hello has no client name")
            self.hellos[n] = message
            return
        if kind == "hello":
            self.violations.append(f"connection {n}: a second hello")
        elif kind == "transcript_ack":
            self._check_ack(n, message)
        else:
            self.violations.append(f"connection {n}: unexpected client message type {kind!r}")

    def _check_ack(self, n: int, ack: dict) -> None:
        self.acks.append((n, ack))
        for problem in _ack_problems(ack):
            self.violations.append(f"connection {n}: ack {ack.get('event_id')!r}: {problem}")
        key = self._ack_key(ack)
        if key in self._ignored[n] and key not in self._expected[n]:
            self.violations.append(f"connection {n}: acked {key!r}, a message that deserves no ack")
            return
        if key not in self._expected[n]:
            self.violations.append(f"connection {n}: ack for {key!r}, never sent on this connection")
            return
        self._acked[n][key] = self._acked[n].get(key, 0) + 1
        if self._acked[n][key] > self._expected[n][key]:
            self.violations.append(f"connection {n}: more acks for {key!r} than deliveries")

    @staticmethod
    def _ack_key(message: dict) -> Any:
        event_id = message.get("event_id")
        return event_id if event_id is not None else ("direct", message.get("conversation_id"))

    # -- pushing -------------------------------------------------------------------------------------

    def _conn(self, n: int | None) -> tuple[int, ServerConnection]:
        if n is None:
            if not self._conns:
                raise AssertionError("no open connection")
            n = max(self._conns)
        if n not in self._conns:
            raise AssertionError(f"connection {n} is not open")
        return n, self._conns[n]

    async def send_event(self, event: dict, conn: int | None = None) -> int:
        """Push an event (a dict) to connection `conn` (default: the newest); return the connection."""
        n, ws = self._conn(conn)
        key = self._ack_key(event)
        if _deserves_ack(event):
            self._expected[n][key] = self._expected[n].get(key, 0) + 1
        else:
            self._ignored[n].add(key)
        await ws.send(json.dumps(event))
        return n

    async def send_raw(self, text: str, conn: int | None = None) -> int:
        """Push raw text (e.g. malformed JSON) — it deserves no ack."""
        n, ws = self._conn(conn)
        await ws.send(text)
        return n

    async def send_oversized(self, nbytes: int, conn: int | None = None) -> int:
        """Push a well-formed `transcript_url` event padded to exactly `nbytes` bytes (no ack expected)."""
        n, ws = self._conn(conn)
        event = transcript_url_event("evt_oversized", pad="")
        event["pad"] = "x" * max(0, nbytes - len(json.dumps(event)))
        text = json.dumps(event)
        self._ignored[n].add("evt_oversized")
        await ws.send(text)
        return n

    async def drop(self, conn: int | None = None, *, code: int = 1012, reason: str = "restart",
                   abort: bool = False) -> int:
        """Close a connection from the server side (a close frame, or `abort` the TCP connection)."""
        n, ws = self._conn(conn)
        if abort:
            ws.transport.abort()
        else:
            await ws.close(code, reason)
        await self.wait_closed(n)
        return n

    def set_key(self, key: str | None) -> None:
        """Rotate the key: later upgrades must carry the new one (open connections stay)."""
        self.key = key

    # -- waiting -------------------------------------------------------------------------------------

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
        """Wait (on state changes, not a poll) until `predicate()` is truthy; return its value."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(predicate), timeout)
            except (TimeoutError, asyncio.TimeoutError):
                raise AssertionError(f"fake Smartnumbers: timed out waiting for {predicate}") from None
        return predicate()

    async def wait_connection(self, n: int, timeout: float = 5.0) -> int:
        """Wait until connection `n` (1-based) is open and has said hello."""
        await self.wait_for(lambda: n in self.hellos, timeout)
        return n

    async def wait_closed(self, n: int, timeout: float = 5.0) -> tuple[int | None, str]:
        """Wait until connection `n` has closed; return (close code the client sent, reason)."""
        await self.wait_for(lambda: n in self.closed, timeout)
        return self.closed[n]

    async def wait_rejected(self, count: int, timeout: float = 5.0) -> None:
        await self.wait_for(lambda: self.rejected >= count, timeout)

    async def ack_for(self, event_id: str, timeout: float = 5.0, conn: int | None = None) -> dict:
        """The first ack for `event_id` (on connection `conn`, if given), waiting for it."""
        def found() -> dict | None:
            return next((a for c, a in self.acks
                         if a.get("event_id") == event_id and (conn is None or c == conn)), None)
        return await self.wait_for(found, timeout)

    def acks_for(self, event_id: str | None) -> list[tuple[int, dict]]:
        return [(c, a) for c, a in self.acks if a.get("event_id") == event_id]

    def assert_clean(self) -> None:
        if self.violations:
            raise AssertionError("Smartnumbers protocol violations:\n  " + "\n  ".join(self.violations))
