"""The Smartnumbers stream client: one outbound WebSocket that receives transcript events and acks them.

Rules (docs/listener.md, "Acknowledgements"; the stream protocol as Smartnumbers documents it):

- `check_stream_url` (pure, no I/O) runs at construction and again before every connect: `wss://`
  only, host in the allow-list (exact, case-insensitive), no userinfo, no fragment. The
  local-development flag relaxes exactly one thing: `ws://` becomes acceptable to a loopback host
  (127.0.0.0/8, ::1 and its IPv4-mapped forms, `localhost`) — the host must still be approved.
- The key is read from its callable before every connect (a rotated key works without a restart) and
  goes only into the upgrade request, `Authorization: Bearer <key>`. It is never put in a message or
  a log line: an exception whose text carries it (a server echoing the header back) has it replaced
  in every form it can take there (as sent, percent- or plus-encoded, `repr`/JSON-escaped, with its
  spaces collapsed); what websockets logs about the connection (its debug dump of the headers) goes
  through `common.redact.connection_logger`, as the Realtime connection's does, which removes the key
  in every one of those forms. Redirects are not followed and proxy environment variables are ignored, so
  the key only ever travels to the approved host.
- Ids, types and close reasons from the server or an event are untrusted: every log line shows them
  through `listener.text.quote_untrusted` (one quoted, printable token). A handler that raises is
  one ERROR line naming the event; its traceback goes to DEBUG only, as one quoted line.
- After connecting the client sends `hello`; websockets pings keep the connection alive; frames over
  `max_message_bytes` make websockets close with 1009, which is logged and followed by a reconnect.
- The receive loop never waits for a handler: each `transcript_url` event (and each direct
  transcript — a JSON object with `conversation_id` and `turns` and no `type`) is handled in its own
  task, at most `concurrency` at once, and its ack goes out when the handler returns. A redelivered
  event whose handler is still running is not handled twice: the new delivery waits for the same
  result. Malformed JSON, non-objects and unknown `type`s are ignored and never acked.
- An ack is sent on the connection its event arrived on. When that connection has closed meanwhile
  the ack cannot be sent (logged, counted as `acks_lost`); the server redelivers unacked events
  after the reconnect, so `handle` must be idempotent (the archive's per-transcript claims are).
- Reconnects back off exponentially (1 s doubling to 60 s by default) through `jitter` (full jitter by
  default: `random.uniform(0, delay)`). A *good* connection resets the backoff: one on which `hello`
  was sent and then either at least one well-formed JSON object arrived or which stayed open for
  `good_after` seconds (10 s, by the injected clock). After any disconnect the client waits at least
  one backoff step, so a server that accepts and drops at once is never hammered.
- `stop()` cancels the receive loop, any backoff sleep and the in-flight handlers, closes the socket
  with 1000 and returns within about a second.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import logging
import random
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.client import connect as _ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from common.redact import connection_logger, scrub_secrets
from listener.addresses import FORBIDDEN_URL_CHARS, HostError, host_of, is_loopback_target
from listener.text import quote_untrusted

__all__ = [
    "KEY_VARIABLE",
    "NoRedirectConnect",
    "PROTOCOL_VERSION",
    "StreamClient",
    "StreamConfigError",
    "StreamStats",
    "StreamTarget",
    "check_key",
    "check_stream_url",
    "full_jitter",
]

PROTOCOL_VERSION = 1
KEY_VARIABLE = "TRANSCRIPT_LISTENER_API_KEY"
HOSTS_VARIABLE = "SMARTNUMBERS_ALLOWED_STREAM_HOSTS"
INSECURE_VARIABLE = "SMARTNUMBERS_ALLOW_INSECURE_LOCAL"
MESSAGE_TOO_BIG = 1009

Handler = Callable[[dict], Awaitable[dict]]


class StreamConfigError(ValueError):
    """The stream cannot be used as configured (URL refused, key missing). One line, never the key."""


# ---------------------------------------------------------------------------------------------------
# pure checks


@dataclass(frozen=True)
class StreamTarget:
    """A stream URL that passed `check_stream_url`. `display` is safe for logs (no query string)."""

    scheme: str
    host: str
    port: int
    local_dev: bool
    display: str


def _refuse(reason: str) -> StreamConfigError:
    return StreamConfigError("stream URL refused: " + " ".join(reason.split()))


def _host_of(netloc: str) -> tuple[str, str | None]:
    try:
        return host_of(netloc)
    except HostError as exc:
        raise _refuse(str(exc)) from None


def _approved(allowed_hosts: frozenset[str]) -> frozenset[str]:
    out = set()
    for entry in allowed_hosts:
        host = entry.strip().lower().rstrip(".")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        try:
            host = str(ipaddress.ip_address(host))
        except ValueError:
            pass
        if host:
            out.add(host)
    return frozenset(out)


def check_stream_url(url: str, *, allowed_hosts: frozenset[str], allow_insecure_local: bool) -> StreamTarget:
    """Decide whether the API key may be sent to `url`; return it parsed or raise StreamConfigError.

    `wss://` only, to a host in `allowed_hosts` (exact, case-insensitive); no credentials in the URL,
    no fragment. With `allow_insecure_local`, `ws://` is accepted to a loopback host only."""
    if not isinstance(url, str) or not url.strip():
        raise _refuse("empty or not a string")
    if FORBIDDEN_URL_CHARS.search(url):
        raise _refuse("contains whitespace, control characters or '\\'")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise _refuse("malformed URL or port") from None
    scheme = parts.scheme.lower()
    if scheme not in ("wss", "ws") or not parts.netloc:
        raise _refuse("only wss:// URLs are accepted")
    if "@" in parts.netloc:
        raise _refuse("it contains credentials (user:password@); the key goes in TRANSCRIPT_LISTENER_API_KEY")
    if parts.fragment or url.endswith("#"):
        raise _refuse("it contains a fragment (#...)")
    host, ip = _host_of(parts.netloc)
    loopback = is_loopback_target(host, ip)
    if scheme == "ws":
        if not allow_insecure_local:
            raise _refuse(
                f"only wss:// is accepted (ws:// needs {INSECURE_VARIABLE}=true and a loopback host)"
            )
        if not loopback:
            raise _refuse(
                f"ws:// is allowed only to a loopback host (127.0.0.0/8, ::1, localhost), not {host}; use wss://"
            )
    approved = _approved(allowed_hosts)
    if not approved:
        raise _refuse(f"no approved stream hosts; set {HOSTS_VARIABLE}")
    if host not in approved:
        raise _refuse(f"host {host} is not in {HOSTS_VARIABLE} (exact host names, comma-separated)")
    port = port if port is not None else (443 if scheme == "wss" else 80)
    shown = f"[{host}]" if ip and ":" in host else host
    default = port == (443 if scheme == "wss" else 80)
    display = f"{scheme}://{shown}{'' if default else f':{port}'}{parts.path or '/'}"
    return StreamTarget(scheme=scheme, host=host, port=port, local_dev=scheme == "ws", display=display[:160])


def check_key(key: str | None) -> str:
    """The key, stripped, or StreamConfigError saying why it cannot be used (never echoing it)."""
    if key is None or not isinstance(key, str) or not key.strip():
        raise StreamConfigError(
            f"{KEY_VARIABLE} is not set; run setup or put the stream key in the environment or .env"
        )
    key = key.strip()
    if not key.isascii() or not key.isprintable():
        raise StreamConfigError(f"{KEY_VARIABLE} contains characters an HTTP header cannot carry")
    return key


def full_jitter(delay: float) -> float:
    """The default jitter: anywhere in [0, delay] ("full jitter")."""
    return random.uniform(0.0, delay)


REDACTED = "<redacted>"


def _redact(text: str, key: str | None) -> str:
    """One line for a log or `last_error`: the key (in every form `common.redact.secret_forms` knows)
    replaced, whitespace collapsed, at most 300 characters."""
    keys = [key] if key else []
    line = " ".join(scrub_secrets(str(text), keys, REDACTED).split())
    line = scrub_secrets(line, keys, REDACTED)  # a form that only appears once whitespace is collapsed
    return line if len(line) <= 300 else line[:297] + "..."


def _short(value: Any) -> str:
    """A value from the server or an event (an id, a type, a close reason) for a log line."""
    return quote_untrusted(value, 80)


class NoRedirectConnect(_ws_connect):
    """websockets' connect, refusing redirects: the key and the events only ever use the approved host."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


# ---------------------------------------------------------------------------------------------------
# the client


@dataclass
class StreamStats:
    """Counters for `doctor`/status. `reconnects`: successful connections after the first;
    `ignored`: unknown types and non-object JSON; `malformed`: not JSON; `oversized`: connections
    closed with 1009; `acks_lost`: a handler finished after its connection had closed; `dropped`:
    events refused because `max_pending` deliveries were waiting (the server redelivers them); `lag_s`:
    how long the oldest event still being handled (or waiting for a handler) has waited, by the
    injected clock (0 when none is)."""

    connects: int = 0
    reconnects: int = 0
    failed_connects: int = 0
    auth_failures: int = 0
    acks_sent: int = 0
    acks_lost: int = 0
    handler_errors: int = 0
    ignored: int = 0
    malformed: int = 0
    oversized: int = 0
    dropped: int = 0
    connected: bool = False
    in_flight: int = 0
    lag_s: float = 0.0
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class StreamClient:
    """Outbound Smartnumbers stream client; see the module docstring for the behaviour."""

    def __init__(
        self,
        url: str,
        *,
        key: Callable[[], str | None],
        allowed_hosts: frozenset[str],
        allow_insecure_local: bool,
        handle: Handler,
        client_name: str = "switchboard",
        max_message_bytes: int = 1 << 20,
        concurrency: int = 4,
        max_pending: int = 256,
        backoff: tuple[float, float] = (1.0, 60.0),
        jitter: Callable[[float], float] = full_jitter,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        connect: Callable[..., Awaitable[Any]] = NoRedirectConnect,
        clock: Callable[[], float] = time.monotonic,
        good_after: float = 10.0,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        open_timeout: float = 10.0,
        logger: logging.Logger | None = None,
    ) -> None:
        if concurrency < 1 or max_pending < 1 or max_message_bytes < 1:
            raise ValueError("concurrency, max_pending and max_message_bytes must be at least 1")
        base, cap = backoff
        if not 0 < base <= cap:
            raise ValueError("backoff must be (base, cap) with 0 < base <= cap")
        self._allowed_hosts = frozenset(allowed_hosts)
        self._allow_insecure_local = bool(allow_insecure_local)
        self.target = check_stream_url(
            url, allowed_hosts=self._allowed_hosts, allow_insecure_local=self._allow_insecure_local
        )
        self._url = url
        self._key = key
        self._handle = handle
        self.client_name = client_name
        self.max_message_bytes = max_message_bytes
        self._sem = asyncio.Semaphore(concurrency)
        self._max_pending = max_pending
        self._base, self._cap = float(base), float(cap)
        self._jitter, self._sleep, self._connect, self._clock = jitter, sleep, connect, clock
        self._good_after = good_after
        self._ping_interval, self._ping_timeout, self._open_timeout = ping_interval, ping_timeout, open_timeout
        self._log = logger or logging.getLogger("listener.stream")
        self._ws_log = connection_logger(self._log.name + ".websocket", lambda: [self._last_key or ""])
        self._stats = StreamStats()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._ws: Any = None
        self._jobs: dict[str, asyncio.Task] = {}  # event_id -> running handler (redelivery dedupe)
        self._handlers: set[asyncio.Task] = set()
        self._taken_at: dict[asyncio.Task, float] = {}  # handler -> when its event was taken (the lag)
        self._deliveries: set[asyncio.Task] = set()
        self._last_key: str | None = None

    # -- public ------------------------------------------------------------------------------------

    @property
    def stats(self) -> StreamStats:
        """A snapshot of the counters."""
        oldest = min((at for job, at in self._taken_at.items() if not job.done()), default=None)
        lag = max(0.0, self._clock() - oldest) if oldest is not None else 0.0
        return dataclasses.replace(self._stats, in_flight=len(self._handlers), lag_s=lag)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Check the URL and the key (StreamConfigError if either is unusable), then run in the
        background until `stop()`."""
        if self.running:
            raise RuntimeError("the stream client is already running")
        check_stream_url(self._url, allowed_hosts=self._allowed_hosts, allow_insecure_local=self._allow_insecure_local)
        check_key(self._key())
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="smartnumbers-stream")

    async def run(self) -> None:
        """`start()`, then wait until stopped (stops the client when this is cancelled)."""
        await self.start()
        assert self._task is not None
        try:
            await asyncio.shield(self._task)
        finally:
            if self.running:
                await self.stop()

    async def stop(self, timeout: float = 1.0) -> None:
        """Cancel the receive loop, any backoff wait and in-flight handlers; close with 1000."""
        self._stopping = True
        tasks = [t for t in (*self._deliveries, *self._handlers) if not t.done()]
        if self._task is not None and not self._task.done():
            tasks.append(self._task)
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            if pending:
                self._log.warning("stream client: %d task(s) did not stop within %.1f s", len(pending), timeout)
        self._stats.connected = False

    async def drain(self) -> None:
        """Wait until every handler and ack in flight has finished (tests, graceful shutdown)."""
        while pending := [t for t in (*self._deliveries, *self._handlers) if not t.done()]:
            await asyncio.wait(pending)

    # -- the connection loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0  # consecutive connections that were not good
        while not self._stopping:
            good = await self._attempt()
            if self._stopping:
                break
            failures = 0 if good else failures
            delay = min(self._cap, self._base * 2 ** min(failures, 32))
            failures += 1
            wait = max(0.0, float(self._jitter(delay)))
            self._log.info("stream: next connection attempt in %.1f s", wait)
            await self._sleep(wait)

    def _fail(self, message: str, *, level: int = logging.WARNING) -> None:
        line = _redact(message, self._last_key)
        self._stats.last_error = line
        self._log.log(level, "stream: %s", line)

    async def _attempt(self) -> bool:
        """One connection, from the key check to the close. True if it was a good connection."""
        try:
            check_stream_url(
                self._url, allowed_hosts=self._allowed_hosts, allow_insecure_local=self._allow_insecure_local
            )
            key = check_key(self._key())
        except StreamConfigError as exc:
            self._stats.failed_connects += 1
            self._fail(f"{exc}; retrying", level=logging.ERROR)
            return False
        except Exception as exc:  # the key callable itself failed
            self._stats.failed_connects += 1
            self._fail(f"reading {KEY_VARIABLE} failed ({type(exc).__name__}); retrying", level=logging.ERROR)
            return False
        self._last_key = key
        try:
            ws = await self._connect(
                self._url,
                additional_headers={"Authorization": f"Bearer {key}"},
                max_size=self.max_message_bytes,
                ping_interval=self._ping_interval,
                ping_timeout=self._ping_timeout,
                open_timeout=self._open_timeout,
                close_timeout=2.0,
                proxy=None,
                logger=self._ws_log,
            )
        except asyncio.CancelledError:
            raise
        except InvalidStatus as exc:
            self._stats.failed_connects += 1
            status = exc.response.status_code
            if status in (401, 403):
                self._stats.auth_failures += 1
                self._fail(
                    f"{self.target.display} refused the key (HTTP {status}); check {KEY_VARIABLE} "
                    "(a rotated key is picked up on the next attempt)",
                    level=logging.ERROR,
                )
            elif 300 <= status < 400:
                self._fail(f"{self.target.display} answered HTTP {status} (a redirect); redirects are not followed")
            else:
                self._fail(f"{self.target.display} refused the connection (HTTP {status})")
            return False
        except Exception as exc:
            self._stats.failed_connects += 1
            self._fail(f"could not connect to {self.target.display}: {type(exc).__name__}: {exc}")
            return False

        self._stats.connects += 1
        if self._stats.connects > 1:
            self._stats.reconnects += 1
        self._stats.connected = True
        self._ws = ws
        opened = self._clock()
        received = 0
        close_code = 1000
        try:
            await ws.send(json.dumps({"type": "hello", "protocol_version": PROTOCOL_VERSION, "client": self.client_name}))
            self._stats.last_error = None
            self._log.info("stream: connected to %s", self.target.display)
            while True:
                raw = await ws.recv()
                if self._dispatch(ws, raw):
                    received += 1
        except asyncio.CancelledError:
            raise
        except ConnectionClosed as exc:
            self._on_closed(exc)
        except Exception as exc:  # a bug here must not kill the listener: reconnect
            close_code = 1011
            self._fail(f"receive loop failed ({type(exc).__name__}: {exc}); reconnecting", level=logging.ERROR)
        finally:
            self._ws = None
            self._stats.connected = False
            await self._close(ws, close_code)
        return received > 0 or self._clock() - opened >= self._good_after

    def _on_closed(self, exc: ConnectionClosed) -> None:
        sent, rcvd = exc.sent, exc.rcvd
        if sent is not None and sent.code == MESSAGE_TOO_BIG and exc.rcvd_then_sent is not True:
            self._stats.oversized += 1
            self._fail(
                f"a message exceeded {self.max_message_bytes} bytes (SMARTNUMBERS_MAX_MESSAGE_BYTES); "
                "closed with 1009, reconnecting"
            )
        elif rcvd is not None:
            self._fail(f"the server closed the stream (code {rcvd.code} {_short(rcvd.reason)}); reconnecting")
        elif sent is not None:
            self._fail(f"the stream closed (code {sent.code} {_short(sent.reason)}); reconnecting")
        else:
            self._fail("the connection was lost without a close frame; reconnecting")

    async def _close(self, ws: Any, code: int) -> None:
        try:
            await asyncio.wait_for(ws.close(code=code, reason="client stopping" if self._stopping else ""), 0.5)
        except (TimeoutError, asyncio.TimeoutError):
            transport = getattr(ws, "transport", None)
            if transport is not None:
                transport.abort()
        except asyncio.CancelledError:
            raise
        except Exception:  # already closed, or the transport is gone
            pass

    # -- messages --------------------------------------------------------------------------------------

    def _dispatch(self, ws: Any, raw: str | bytes) -> bool:
        """Route one message without waiting for it. True if it was a well-formed JSON object."""
        size = len(raw)
        try:
            message = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            self._stats.malformed += 1
            self._log.warning("stream: ignored a message that is not valid JSON (%d bytes)", size)
            return False
        if not isinstance(message, dict):
            self._stats.ignored += 1
            self._log.warning("stream: ignored a JSON %s that is not an object", type(message).__name__)
            return False
        kind = message.get("type")
        if kind == "transcript_url" or (kind is None and "conversation_id" in message and "turns" in message):
            self._spawn(ws, message)
        else:
            self._stats.ignored += 1
            self._log.info("stream: ignored a message of unknown type %s", _short(kind))
        return True

    def _spawn(self, ws: Any, event: dict) -> None:
        if len(self._deliveries) >= self._max_pending:
            self._stats.dropped += 1
            self._log.warning(
                "stream: %d events already waiting; event %s not taken (the server redelivers it)",
                len(self._deliveries), _short(event.get("event_id")),
            )
            return
        event_id = event.get("event_id")
        dedupe = event_id if isinstance(event_id, str) and event_id else None
        job = self._jobs.get(dedupe) if dedupe else None
        if job is None:
            job = asyncio.create_task(self._run_handler(event))
            self._handlers.add(job)
            self._taken_at[job] = self._clock()
            job.add_done_callback(self._handlers.discard)
            job.add_done_callback(lambda t: self._taken_at.pop(t, None))
            if dedupe:
                self._jobs[dedupe] = job
                job.add_done_callback(lambda t, k=dedupe: self._jobs.pop(k) if self._jobs.get(k) is t else None)
        else:
            self._log.info("stream: event %s redelivered while still being handled; acking its result", _short(dedupe))
        delivery = asyncio.create_task(self._deliver(ws, event, job))
        self._deliveries.add(delivery)
        delivery.add_done_callback(self._deliveries.discard)

    def _failure(self, event: dict, name: str) -> dict:
        return {
            "event_id": event.get("event_id"),
            "conversation_id": event.get("conversation_id"),
            "success": False,
            "stages": {},
            "errors": [{"stage": "internal", "message": name}],
            "job_id": None,
            "job_ids": [],
        }

    async def _run_handler(self, event: dict) -> dict:
        async with self._sem:
            try:
                result = await self._handle(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._stats.handler_errors += 1
                # One line (the ids quoted: they are the caller's); the traceback only at DEBUG.
                self._log.error(
                    "stream: handling event %s (call %s) failed: %s; acked as an internal error",
                    _short(event.get("event_id")), _short(event.get("conversation_id")), type(exc).__name__,
                )
                if self._log.isEnabledFor(logging.DEBUG):  # its text may carry the caller's words: one line
                    trace = "".join(traceback.format_exception(exc))
                    self._log.debug("stream: the handler's traceback: %s", quote_untrusted(trace[-4000:], 4000))
                return self._failure(event, type(exc).__name__)
        if not isinstance(result, dict):
            self._stats.handler_errors += 1
            self._log.error("stream: the handler returned %s, not an ack body", type(result).__name__)
            return self._failure(event, "InvalidAck")
        return result

    def _ack_text(self, event: dict, body: dict) -> str:
        ack: dict[str, Any] = {"type": "transcript_ack", "protocol_version": PROTOCOL_VERSION}
        ack.update((k, v) for k, v in body.items() if k not in ("type", "protocol_version"))
        ack.setdefault("event_id", event.get("event_id"))
        ack.setdefault("conversation_id", event.get("conversation_id"))
        try:
            return json.dumps(ack)
        except (TypeError, ValueError):
            self._stats.handler_errors += 1
            self._log.error("stream: the ack for event %s is not JSON-serialisable", _short(event.get("event_id")))
            failure = {"type": "transcript_ack", "protocol_version": PROTOCOL_VERSION}
            return json.dumps({**failure, **self._failure(event, "UnserializableAck")})

    async def _deliver(self, ws: Any, event: dict, job: asyncio.Task) -> None:
        body = await asyncio.shield(job)
        text = self._ack_text(event, body)
        try:
            await ws.send(text)
        except ConnectionClosed:
            self._stats.acks_lost += 1
            self._log.warning(
                "stream: the ack for event %s was not sent: its connection closed while it was handled; "
                "the server redelivers it after the reconnect", _short(event.get("event_id")),
            )
            return
        self._stats.acks_sent += 1
