"""The `SWITCHBOARD_HTTP_ADDR` endpoint: `GET /healthz`, `GET /readyz`, `GET /metrics`, nothing else.

A few lines over asyncio's streams, in the process's own event loop: readiness and the counters are read
where they live, without a thread or a lock, and `/metrics` may await the store. The parser is strict
and small on purpose — it only has to understand a probe and a scraper:

- one request per connection (`Connection: close`); the request line must be
  `GET|HEAD <path> HTTP/1.0|1.1` (another method: 405; anything else: 400), the head at most
  `MAX_HEAD_BYTES` and `MAX_HEADERS` lines, read within `head_timeout_s` (then 408);
- a query string is ignored; an unknown path is 404; at most `MAX_CONNECTIONS` at once (then 503);
- answers are short plain text (or the Prometheus exposition) and never hold a setting's value, a
  token, a member or a transcript: readiness says its state, `/metrics` only counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

from bot.fleet.metrics import CONTENT_TYPE, Metrics
from bot.fleet.readiness import Readiness
from bot.setting_rules import show_address

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8192
MAX_HEADERS = 64
MAX_CONNECTIONS = 32
HEAD_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
TEXT = "text/plain; charset=utf-8"
_REQUEST_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+) (/[!-~]*) HTTP/1\.[01]\r?\n")
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
            500: "Internal Server Error", 503: "Service Unavailable"}

Answer = tuple[int, str, bytes]  # status, content type, body


class EndpointError(Exception):
    """The endpoint cannot listen where it was asked to; the message is one line saying what to do."""


class HealthEndpoint:
    def __init__(self, readiness: Readiness, metrics: Metrics, *, head_timeout_s: float = HEAD_TIMEOUT_S) -> None:
        self.readiness = readiness
        self.metrics = metrics
        self._head_timeout_s = head_timeout_s
        self._open = 0
        self._routes: dict[str, Callable[[], Awaitable[Answer]]] = {
            "/healthz": self._health, "/readyz": self._ready, "/metrics": self._metrics}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: one request, one answer, closed."""
        self._open += 1
        try:
            head = b""
            if self._open > MAX_CONNECTIONS:
                status, kind, body = 503, TEXT, b"busy\n"
            else:
                status, kind, body, head = await self._answer(reader)
            await self._write(writer, status, kind, body, head_only=head.startswith(b"HEAD "))
        except (ConnectionError, TimeoutError):
            pass  # the client went away, or did not read its answer
        finally:
            self._open -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[int, str, bytes, bytes]:
        try:
            head = await asyncio.wait_for(_read_head(reader), self._head_timeout_s)
        except TimeoutError:
            return 408, TEXT, b"request timeout\n", b""
        except ValueError:  # too long, too many lines, or cut short
            return 400, TEXT, b"bad request\n", b""
        line = _REQUEST_LINE.fullmatch(head.split(b"\n", 1)[0] + b"\n")
        if line is None:
            return 400, TEXT, b"bad request\n", head
        method, target = line.group(1), line.group(2).decode("ascii")
        if method not in (b"GET", b"HEAD"):
            return 405, TEXT, b"only GET and HEAD\n", head
        route = self._routes.get(target.split("?", 1)[0])
        if route is None:
            return 404, TEXT, b"not found: /healthz, /readyz and /metrics are served here\n", head
        try:
            return (*await route(), head)
        except Exception:
            log.exception("answering %s failed", target.split("?", 1)[0])
            return 500, TEXT, b"internal error (logged)\n", head

    async def _health(self) -> Answer:
        return 200, TEXT, b"ok\n"

    async def _ready(self) -> Answer:
        readiness = self.readiness
        return (200 if readiness.is_ready else 503), TEXT, f"{readiness.reason}\n".encode()

    async def _metrics(self) -> Answer:
        return 200, CONTENT_TYPE, await self.metrics.render()

    async def _write(self, writer: asyncio.StreamWriter, status: int, kind: str, body: bytes, *,
                     head_only: bool) -> None:
        head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                "Cache-Control: no-store\r\nConnection: close\r\n\r\n").encode("ascii")
        writer.write(head if head_only else head + body)
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    """The request line and headers, up to the blank line; ValueError when too long or cut short."""
    head = bytearray()
    for _ in range(MAX_HEADERS + 1):
        try:
            line = await reader.readuntil(b"\n")
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError):
            raise ValueError("no complete head") from None
        head += line
        if len(head) > MAX_HEAD_BYTES:
            raise ValueError("head too long")
        if line in (b"\r\n", b"\n"):
            return bytes(head)
    raise ValueError("too many header lines")


@contextlib.asynccontextmanager
async def serving(address: tuple[str, int] | None, endpoint: HealthEndpoint) -> AsyncIterator[asyncio.Server | None]:
    """Listen on `address` (None: nothing is served) until the block ends. Raises EndpointError (one line)
    when the address cannot be had: the port is taken, the host is not this machine's, no such host."""
    if address is None:
        yield None
        return
    host, port = address
    try:
        server = await asyncio.start_server(endpoint.handle, host, port, limit=MAX_HEAD_BYTES)
    except OSError as exc:
        raise EndpointError(f"cannot serve health and metrics on {show_address(address)} (SWITCHBOARD_HTTP_ADDR): "
                            f"{_why(exc)}") from None
    log.info("health and metrics on http://%s (/healthz, /readyz, /metrics)", show_address(address))
    try:
        yield server
    finally:
        server.close()
        await server.wait_closed()


def describe(address: tuple[str, int] | None) -> str:
    """What `doctor` says about SWITCHBOARD_HTTP_ADDR."""
    if address is None:
        return "off: SWITCHBOARD_HTTP_ADDR is not set (no /healthz, /readyz or /metrics)"
    where = f"http://{show_address(address)}: /healthz, /readyz and /metrics while `switchboard run` or `listen` runs"
    if address[0] == "localhost" or _loopback(address[0]):
        return where
    return where + " (reachable from other machines: they answer no secrets; firewall the port as you see fit)"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _why(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return "no such host; use an IP address of this machine or a name that resolves to one"
    if exc.errno == errno.EADDRINUSE:
        return "the port is in use; choose another port, or stop what listens there"
    if exc.errno == errno.EACCES:
        return "permission denied; ports below 1024 need privileges, use a higher one"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "this machine has no such address; use one of its own (or 0.0.0.0 for all)"
    return exc.strerror or type(exc).__name__
