"""URL rules shared by every domain: where a key may be sent (a pure check of an endpoint URL), what
counts as loopback, and a form of a URL that is safe to print.

A key travels only over TLS (`wss://`, `https://`). The plain scheme (`ws://`, `http://`) is allowed
for loopback addresses only — 127.0.0.0/8, ::1 and `localhost` — so local fakes and proxies work
while nothing leaves the machine in clear text. A URL that carries credentials itself
(`ws://user:key@host`, `?api_key=…`) is refused, and no message ever repeats a URL's userinfo or query.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import SplitResult, parse_qsl, urlsplit

LOOPBACK = "127.0.0.0/8, ::1, localhost"
# Query parameter names that carry a credential (compared lowercased, `-` as `_`).
CREDENTIAL_PARAMS = frozenset({"key", "api_key", "apikey", "token", "access_token", "auth", "authorization",
                               "secret", "client_secret", "password", "pass", "sig", "signature"})
_TLS_FOR = {"ws": "wss", "http": "https"}


class UnsafeEndpoint(ValueError):
    """The URL is malformed, carries credentials, or would send a key in clear text to another host."""


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 (also IPv4-mapped loopback) and the name `localhost`."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def display_url(url: str) -> str:
    """`scheme://host[:port]/path`, without userinfo, query or fragment: safe in any message.

    A value that is not a URL at all is shown only when short: a key pasted into the wrong
    variable must not be echoed.
    """
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
    except ValueError:
        parts, host = None, None
    if parts is None or not parts.scheme or host is None:
        text = url.strip()
        return text if len(text) <= 24 else f"<{len(text)} characters, not shown>"
    shown = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"
    return shown + ("?…" if parts.query else "")


def check_key_endpoint(url: str, *, tls: str = "wss") -> str:
    """Return `url` if a key may be sent there; raise UnsafeEndpoint saying why and what to use.

    `tls` is the scheme required for other hosts (`wss` or `https`); its plain twin (`ws`, `http`)
    is accepted for loopback hosts only.
    """
    plain = {v: k for k, v in _TLS_FOR.items()}[tls]
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
    except ValueError:
        raise UnsafeEndpoint(f"not a URL; use {tls}://host/path") from None
    scheme = parts.scheme.lower()
    if scheme not in (tls, plain) or not parts.netloc:
        raise UnsafeEndpoint(f"not a {tls}:// URL; use {tls}://host/path ({plain}:// only for a loopback "
                             f"address: {LOOPBACK})")
    if parts.username is not None or parts.password is not None:
        raise UnsafeEndpoint("credentials in the URL are refused; remove the user:password@ part and put "
                             "the key in its own variable")
    named = [name for name, _ in parse_qsl(parts.query, keep_blank_values=True)
             if name.lower().replace("-", "_") in CREDENTIAL_PARAMS]
    if named:
        raise UnsafeEndpoint(f"a credential in the URL's query ({named[0]}=…) is refused; remove it and put the "
                             "key in its own variable")
    if not host:
        raise UnsafeEndpoint(f"has no host; use {tls}://host/path")
    if _port(parts) == -1:
        raise UnsafeEndpoint("has an invalid port; use a number from 1 to 65535")
    if scheme == plain and not is_loopback(host):
        raise UnsafeEndpoint(f"{plain}:// would send the key in clear text to {host}; use {tls}://, or "
                             f"{plain}:// only for a loopback address ({LOOPBACK})")
    return url.strip()


def _port(parts: SplitResult) -> int | None:
    """The port, None when absent, -1 when malformed (urlsplit raises on access)."""
    try:
        port = parts.port
    except ValueError:
        return -1
    return -1 if port == 0 else port
