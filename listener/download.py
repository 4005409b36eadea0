"""Fetch a transcript from its `transcript_url`, safely (the I/O shell around `listener.addresses`).

The order matters, it closes the DNS-rebinding window the old plugin had:

1. `check_transcript_url` (scheme, port, userinfo, allow-list, `expires_at`);
2. resolve the host ONCE;
3. vet EVERY address it resolved to (any refused address refuses the download);
4. connect to a vetted address itself: the request goes to `https://<ip>/path` while the `Host`
   header and TLS (SNI *and* certificate verification, via httpcore's `sni_hostname` request
   extension, which becomes `server_hostname` for `SSLContext.wrap_bio`) keep the real name;
5. no proxies, no .netrc, no `SSL_CERT_*` from the environment (`trust_env=False`); redirects are
   not followed and any 3xx is a refusal; non-2xx is an error with the status; the body is streamed
   and stops past `max_bytes`; everything runs under one `timeout_s` deadline.

Errors are `TranscriptDownloadError`: one line, says what to do, never the query string.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import httpx

from listener.addresses import ParsedURL, UnsafeTranscriptURL, check_transcript_url, vet_address

__all__ = ["Resolver", "TranscriptDownloadError", "Vet", "download_transcript", "system_resolver"]

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
        return httpx.create_ssl_context(verify=True, trust_env=False)
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


async def _fetch_from(
    client: httpx.AsyncClient, parsed: ParsedURL, address: str, port: int, max_bytes: int | None
) -> bytes:
    url = _request_url(parsed, address, port)
    request = client.build_request(
        "GET",
        url,
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
        if (
            max_bytes is not None
            and declared is not None
            and declared.isdigit()
            and int(declared) > max_bytes
        ):
            raise _too_big(parsed, max_bytes, status)
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if max_bytes is not None and len(body) > max_bytes:
                raise _too_big(parsed, max_bytes, status)
        return bytes(body)
    finally:
        await response.aclose()


def _too_big(parsed: ParsedURL, max_bytes: int, status: int) -> TranscriptDownloadError:
    return TranscriptDownloadError(
        f"transcript download stopped: {parsed.display} is larger than {max_bytes} bytes; "
        "raise the size limit if this transcript is genuine",
        refused=True,
        status=status,
    )


async def download_transcript(
    url: str,
    *,
    resolver: Resolver = system_resolver,
    now: datetime | None = None,
    expires_at: str | None = None,
    allowed_hosts: frozenset[str] = frozenset(),
    allow_insecure_local: bool = False,
    max_bytes: int | None = None,
    timeout_s: float = 30.0,
    verify: ssl.SSLContext | None = None,
    vet: Vet = vet_address,
    connect_port: int | None = None,
) -> bytes:
    """The transcript's bytes, fetched under the SSRF rules (see the module docstring).

    `resolver(host) -> [ip, ...]` is called once; `vet(ip, allow_loopback=...)` judges every answer
    (injectable so tests can admit exactly their loopback server); `verify` is the client SSL
    context (default: the certifi bundle; must verify certificates and hostnames); `connect_port`
    overrides only the TCP port connected to (tests: the server cannot listen on 443) — the URL's
    port rules, the Host header and TLS name are unchanged. `timeout_s` bounds the whole download.
    Raises TranscriptDownloadError."""
    if max_bytes is not None and max_bytes < 0:
        raise ValueError("max_bytes must be >= 0 or None")
    try:
        parsed = check_transcript_url(
            url,
            now=now if now is not None else datetime.now(UTC),
            expires_at=expires_at,
            allowed_hosts=allowed_hosts,
            allow_insecure_local=allow_insecure_local,
        )
    except UnsafeTranscriptURL as exc:
        raise TranscriptDownloadError(str(exc), refused=True) from exc
    ssl_context = _client_ssl_context(verify)
    port = connect_port if connect_port is not None else parsed.port

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
                    try:
                        return await _fetch_from(client, parsed, address, port, max_bytes)
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
        raise TranscriptDownloadError(
            f"transcript download timed out after {timeout_s:g}s ({parsed.display}); retry later",
            retryable=True,
        ) from None
    except httpx.TimeoutException:
        raise TranscriptDownloadError(
            f"transcript download timed out ({parsed.display}); retry later", retryable=True
        ) from None
    except httpx.HTTPError as exc:
        raise TranscriptDownloadError(
            f"transcript download failed: {parsed.display}: {type(exc).__name__} ({_short(exc)}); retry later",
            retryable=True,
        ) from None


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
