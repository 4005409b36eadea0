"""Fetch a transcript from its `transcript_url`, safely (the I/O shell around `listener.addresses`).

The order matters: it closes the DNS-rebinding window a check-then-connect downloader leaves open:

1. `check_transcript_url` (length, scheme, port, userinfo, allow-list, `expires_at`);
2. resolve the host ONCE;
3. vet EVERY address it resolved to (any refused address refuses the download);
4. connect to a vetted address itself: the request goes to `https://<ip>/path` while the `Host`
   header and TLS (SNI *and* certificate verification, via httpcore's `sni_hostname` request
   extension, which becomes `server_hostname` for `SSLContext.wrap_bio`) keep the real name;
5. no proxies, no .netrc, no `SSL_CERT_*` from the environment (`trust_env=False`); redirects are
   not followed and any 3xx is a refusal; non-2xx is an error with the status; a declared
   `Content-Length` over `max_bytes` is refused before the body is read, and the body is counted
   while it streams and stops past `max_bytes`; everything runs under one `timeout_s` deadline —
   total time, not per read: a host that trickles one byte a second is cut off at the deadline.

`TranscriptDownloader` is what the listener uses: those rules plus the limits every download shares —
at most `max_concurrent` downloads at once (fewer than the stream's event concurrency, so slow hosts
can never hold every event slot), a download that finds no free slot within `queue_s` failing as
retryable instead of waiting.

Errors are `TranscriptDownloadError`: one line, says what to do, never the query string.
"""

from __future__ import annotations

import asyncio
import io
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import httpx

from common.tls import verified_tls
from listener.addresses import ParsedURL, UnsafeTranscriptURL, check_transcript_url, vet_address

__all__ = [
    "DEFAULT_MAX_DOWNLOADS",
    "DEFAULT_MAX_TRANSCRIPT_BYTES",
    "DEFAULT_QUEUE_S",
    "DEFAULT_TIMEOUT_S",
    "Resolver",
    "TranscriptDownloadError",
    "TranscriptDownloader",
    "Vet",
    "download_transcript",
    "system_resolver",
]

DEFAULT_MAX_TRANSCRIPT_BYTES = 20 * 1024 * 1024  # SMARTNUMBERS_MAX_TRANSCRIPT_BYTES
DEFAULT_TIMEOUT_S = 30.0  # the whole download, from resolving to the last byte
DEFAULT_MAX_DOWNLOADS = 2  # below the stream client's default event concurrency (4)
DEFAULT_QUEUE_S = 5.0  # how long a download may wait for a free slot

Resolver = Callable[[str], Awaitable[list[str]]]
Vet = Callable[..., "str | None"]  # vet(ip, *, allow_loopback: bool) -> None (allowed) or a reason

USER_AGENT = "switchboard-listener (transcript download)"


class TranscriptDownloadError(Exception):
    """The transcript could not be fetched. `refused` — the download rules said no (do not retry
    the same URL); `retryable` — a transient failure (network, timeout, 5xx/429); `status` — the
    HTTP status when there was one."""

    def __init__(
        self, message: str, *, refused: bool = False, retryable: bool = False, status: int | None = None
    ) -> None:
        super().__init__(" ".join(message.split()))  # always one line
        self.refused = refused
        self.retryable = retryable
        self.status = status


async def system_resolver(host: str) -> list[str]:
    """The host's addresses from the system resolver (`loop.getaddrinfo`), in its order, deduplicated."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, None, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    seen: dict[str, None] = {}
    for _family, _type, _proto, _canon, sockaddr in infos:
        seen.setdefault(str(sockaddr[0]), None)
    return list(seen)


def _client_ssl_context(verify: ssl.SSLContext | None) -> ssl.SSLContext:
    if verify is None:
        return verified_tls()
    if not isinstance(verify, ssl.SSLContext):
        raise TypeError("verify must be an ssl.SSLContext or None")
    if verify.verify_mode != ssl.CERT_REQUIRED or not verify.check_hostname:
        raise ValueError("verify must check certificates and hostnames (CERT_REQUIRED, check_hostname)")
    return verify


async def _resolve_and_vet(parsed: ParsedURL, resolver: Resolver, vet: Vet) -> list[str]:
    if parsed.ip is not None:
        addresses = [parsed.ip]
    else:
        try:
            addresses = [str(a) for a in await resolver(parsed.host)]
        except (OSError, UnicodeError) as exc:
            raise TranscriptDownloadError(
                f"could not resolve {parsed.host} ({type(exc).__name__}); check DNS and retry later",
                retryable=True,
            ) from None
        if not addresses:
            raise TranscriptDownloadError(
                f"{parsed.host} resolved to no addresses; check DNS and retry later", retryable=True
            )
    for address in addresses:
        why = vet(address, allow_loopback=parsed.local_dev)
        if why is not None:
            raise TranscriptDownloadError(
                f"transcript download refused: {parsed.host} resolves to {address} ({why}); "
                "transcripts are only fetched from public addresses",
                refused=True,
            )
    return addresses


def _request_url(parsed: ParsedURL, address: str, port: int) -> str:
    netloc = f"[{address.split('%', 1)[0]}]" if ":" in address else address
    return f"{parsed.scheme}://{netloc}:{port}{parsed.target}"


def _invalid_url(parsed: ParsedURL, exc: httpx.InvalidURL) -> TranscriptDownloadError:
    return TranscriptDownloadError(
        f"transcript download refused: {parsed.display} is not a URL the HTTP client accepts "
        f"({_short(exc)}); ask Smartnumbers to resend the event",
        refused=True,
    )


def _timed_out(parsed: ParsedURL, timeout_s: float) -> TranscriptDownloadError:
    return TranscriptDownloadError(
        f"transcript download timed out after {timeout_s:g}s ({parsed.display}); retry later", retryable=True
    )


async def _fetch_from(
    client: httpx.AsyncClient,
    parsed: ParsedURL,
    address: str,
    port: int,
    max_bytes: int,
    past_deadline: Callable[[], bool],
    timeout_s: float,
) -> bytes:
    request = client.build_request(  # httpx.InvalidURL here becomes a refusal in `_download`
        "GET",
        _request_url(parsed, address, port),
        headers={"Host": parsed.host_header, "Accept-Encoding": "identity", "User-Agent": USER_AGENT},
        # TLS for the real name: SNI and certificate/hostname verification (httpcore passes it as
        # `server_hostname`). Only meaningful for names; an IP literal host verifies as itself.
        extensions={"sni_hostname": parsed.host} if parsed.ip is None else {},
    )
    if request.url.host != address.split("%", 1)[0]:  # the connection must go where we vetted
        raise TranscriptDownloadError("internal error: request host differs from the vetted address")
    response = await client.send(request, stream=True, follow_redirects=False)
    try:
        status = response.status_code
        if 300 <= status < 400:
            raise TranscriptDownloadError(
                f"transcript download refused: {parsed.display} answered with a redirect ({status}); "
                "redirects are not followed — the event must carry the final URL",
                refused=True,
                status=status,
            )
        if not 200 <= status < 300:
            transient = status >= 500 or status in (408, 429)
            raise TranscriptDownloadError(
                f"transcript download failed: {parsed.display} answered HTTP {status}; "
                + ("retry later" if transient else "the link may be expired or wrong, ask for a new event"),
                retryable=transient,
                status=status,
            )
        declared = response.headers.get("Content-Length")
        if declared is not None and declared.isascii() and declared.isdigit() and (
            len(declared) > 18 or int(declared) > max_bytes
        ):
            raise _too_big(parsed, max_bytes, status)
        # One buffer that grows in place; `getvalue()` hands it over without a second full copy.
        body = io.BytesIO()
        async for chunk in response.aiter_bytes():
            if body.tell() + len(chunk) > max_bytes:
                raise _too_big(parsed, max_bytes, status)
            body.write(chunk)
            if past_deadline():  # total time, measured between reads: a trickle cannot reset it
                raise _timed_out(parsed, timeout_s)
        return body.getvalue()
    finally:
        await response.aclose()


def _too_big(parsed: ParsedURL, max_bytes: int, status: int) -> TranscriptDownloadError:
    return TranscriptDownloadError(
        f"transcript download stopped: {parsed.display} is larger than {max_bytes} bytes "
        "(SMARTNUMBERS_MAX_TRANSCRIPT_BYTES); raise the limit if this transcript is genuine",
        refused=True,
        status=status,
    )


def _check(
    url: str,
    *,
    now: datetime,
    expires_at: str | None,
    allowed_hosts: frozenset[str],
    allow_insecure_local: bool,
) -> ParsedURL:
    try:
        return check_transcript_url(
            url,
            now=now,
            expires_at=expires_at,
            allowed_hosts=allowed_hosts,
            allow_insecure_local=allow_insecure_local,
        )
    except UnsafeTranscriptURL as exc:
        raise TranscriptDownloadError(str(exc), refused=True) from None


def _check_limits(max_bytes: int, timeout_s: float) -> None:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError("max_bytes must be a whole number of bytes, at least 1")
    if not timeout_s > 0:
        raise ValueError("timeout_s must be more than 0")


async def download_transcript(
    url: str,
    *,
    resolver: Resolver = system_resolver,
    now: datetime | None = None,
    expires_at: str | None = None,
    allowed_hosts: frozenset[str] = frozenset(),
    allow_insecure_local: bool = False,
    max_bytes: int = DEFAULT_MAX_TRANSCRIPT_BYTES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    verify: ssl.SSLContext | None = None,
    vet: Vet = vet_address,
    connect_port: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> bytes:
    """The transcript's bytes, fetched under the SSRF rules (see the module docstring).

    `resolver(host) -> [ip, ...]` is called once; `vet(ip, allow_loopback=...)` judges every answer
    (injectable so tests can admit exactly their loopback server); `verify` is the client SSL
    context (default: the certifi bundle; must verify certificates and hostnames); `connect_port`
    overrides only the TCP port connected to (tests: the server cannot listen on 443) — the URL's
    port rules, the Host header and TLS name are unchanged. `max_bytes` caps the body (declared or
    counted). `timeout_s` bounds the whole download: on the event loop's timer (a read that never
    returns) and by `clock` between reads (a host that keeps trickling). Raises
    TranscriptDownloadError."""
    _check_limits(max_bytes, timeout_s)
    parsed = _check(
        url,
        now=now if now is not None else datetime.now(UTC),
        expires_at=expires_at,
        allowed_hosts=allowed_hosts,
        allow_insecure_local=allow_insecure_local,
    )
    return await _download(
        parsed,
        resolver=resolver,
        vet=vet,
        ssl_context=_client_ssl_context(verify),
        port=connect_port if connect_port is not None else parsed.port,
        max_bytes=max_bytes,
        timeout_s=timeout_s,
        clock=clock,
    )


async def _download(
    parsed: ParsedURL,
    *,
    resolver: Resolver,
    vet: Vet,
    ssl_context: ssl.SSLContext,
    port: int,
    max_bytes: int,
    timeout_s: float,
    clock: Callable[[], float],
) -> bytes:
    deadline = clock() + timeout_s

    def past_deadline() -> bool:
        return clock() >= deadline

    try:
        async with asyncio.timeout(timeout_s):
            addresses = await _resolve_and_vet(parsed, resolver, vet)
            async with httpx.AsyncClient(
                verify=ssl_context,
                trust_env=False,  # no *_PROXY, no .netrc, no SSL_CERT_FILE
                follow_redirects=False,
                timeout=httpx.Timeout(timeout_s),
                http2=False,
            ) as client:
                last: TranscriptDownloadError | None = None
                for address in addresses:  # all vetted; the next one only if this one is unreachable
                    if past_deadline():
                        raise _timed_out(parsed, timeout_s)
                    try:
                        return await _fetch_from(
                            client, parsed, address, port, max_bytes, past_deadline, timeout_s
                        )
                    except httpx.ConnectError as exc:
                        if _caused_by(exc, ssl.SSLCertVerificationError):
                            raise TranscriptDownloadError(
                                f"transcript download refused: the TLS certificate of {parsed.host} did "
                                f"not verify ({_short(exc)}); check the host or its certificate",
                                refused=True,
                            ) from None
                        last = TranscriptDownloadError(
                            f"could not connect to {parsed.host} at {address} ({_short(exc)}); retry later",
                            retryable=True,
                        )
                assert last is not None
                raise last
    except TimeoutError:
        raise _timed_out(parsed, timeout_s) from None
    except httpx.TimeoutException:
        raise TranscriptDownloadError(
            f"transcript download timed out ({parsed.display}); retry later", retryable=True
        ) from None
    except httpx.InvalidURL as exc:  # not an HTTPError: it must not escape as an internal error
        raise _invalid_url(parsed, exc) from None
    except httpx.HTTPError as exc:
        raise TranscriptDownloadError(
            f"transcript download failed: {parsed.display}: {type(exc).__name__} ({_short(exc)}); retry later",
            retryable=True,
        ) from None


class TranscriptDownloader:
    """The listener's download step: `await downloader(url, expires_at)` is the transcript's bytes or
    a TranscriptDownloadError, under `download_transcript`'s rules and these shared limits:

    - `max_bytes` (SMARTNUMBERS_MAX_TRANSCRIPT_BYTES, default 20 MiB) caps every body;
    - `timeout_s` bounds each download's total time;
    - at most `max_concurrent` downloads run at once. Keep it below the stream client's event
      concurrency: a download holds its event's slot, so slow hosts then hold only some of them and
      other events (direct transcripts, calls already downloaded) still run. A download that finds
      every slot taken waits at most `queue_s` for one (0: not at all), then fails as retryable.

    The URL is checked before a slot is taken: a refused link never waits. `clock` measures the
    deadline between reads; `now` is the wall clock `expires_at` is compared with."""

    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_TRANSCRIPT_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_concurrent: int = DEFAULT_MAX_DOWNLOADS,
        queue_s: float = DEFAULT_QUEUE_S,
        allowed_hosts: frozenset[str] = frozenset(),
        allow_insecure_local: bool = False,
        resolver: Resolver = system_resolver,
        vet: Vet = vet_address,
        verify: ssl.SSLContext | None = None,
        connect_port: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        _check_limits(max_bytes, timeout_s)
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError("max_concurrent must be a whole number, at least 1")
        if not queue_s >= 0:
            raise ValueError("queue_s must be 0 or more")
        self.max_bytes, self.timeout_s = max_bytes, float(timeout_s)
        self.max_concurrent, self.queue_s = max_concurrent, float(queue_s)
        self._allowed_hosts = frozenset(allowed_hosts)
        self._allow_insecure_local = bool(allow_insecure_local)
        self._resolver, self._vet, self._connect_port = resolver, vet, connect_port
        self._ssl_context = _client_ssl_context(verify)
        self._clock, self._now = clock, now
        self._slots = asyncio.Semaphore(max_concurrent)
        self._running = 0

    @property
    def running(self) -> int:
        """Downloads holding a slot now."""
        return self._running

    async def __call__(self, url: str, expires_at: str | None) -> bytes:
        parsed = _check(
            url,
            now=self._now(),
            expires_at=expires_at,
            allowed_hosts=self._allowed_hosts,
            allow_insecure_local=self._allow_insecure_local,
        )
        await self._take_slot(parsed)
        self._running += 1
        try:
            return await _download(
                parsed,
                resolver=self._resolver,
                vet=self._vet,
                ssl_context=self._ssl_context,
                port=self._connect_port if self._connect_port is not None else parsed.port,
                max_bytes=self.max_bytes,
                timeout_s=self.timeout_s,
                clock=self._clock,
            )
        finally:
            self._running -= 1
            self._slots.release()

    async def _take_slot(self, parsed: ParsedURL) -> None:
        if not self._slots.locked():
            await self._slots.acquire()  # free: returns without waiting
            return
        if self.queue_s > 0:
            try:
                async with asyncio.timeout(self.queue_s):
                    await self._slots.acquire()
                return
            except TimeoutError:
                pass
        waited = f" and none finished within {self.queue_s:g}s" if self.queue_s > 0 else ""
        raise TranscriptDownloadError(
            f"transcript download not started ({parsed.display}): {self.max_concurrent} downloads are "
            f"already running{waited} (slow transcript hosts?); retry later",
            retryable=True,
        )


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _short(exc: BaseException) -> str:
    """An exception's text, one line, without any URL query (httpx errors can carry the request URL)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if "?" in text:
        text = text.split("?", 1)[0] + "?…"
    return text[:200]
