"""Which transcript URLs and which IP addresses the listener may fetch from (SSRF rules).

Pure and sans-I/O: no sockets, no DNS, no clock (the caller passes `now`). The rules (also in
docs/listener.md, "Downloads and transcripts"):

- `check_transcript_url` decides whether a URL may be fetched at all: https on the default port, no
  userinfo, an optional exact-host allow-list, `expires_at` not passed. With `allow_insecure_local`
  (local development only) a loopback literal or `localhost` may also be reached over http and on
  any port.
- `vet_address` decides whether one resolved address may be connected to: only globally routable
  unicast, checked through every IPv6 form that embeds an IPv4 address.

Messages are one line and never contain the URL's query string (presigned URLs carry signatures) or
its userinfo.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlsplit

from common.urls import is_loopback

__all__ = ["MAX_URL_CHARS", "ParsedURL", "UnsafeTranscriptURL", "check_transcript_url", "vet_address"]

# A presigned URL with a session token is a few kilobytes; anything near httpx's own 64 KiB limit is
# not a transcript link (and would make httpx raise InvalidURL instead of a download error).
MAX_URL_CHARS = 16 * 1024

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class UnsafeTranscriptURL(ValueError):
    """The transcript URL (or an address it resolved to) is refused by the download rules."""


_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

# Checked in order; the first match gives the reason. Anything that passes these and is still not
# `is_global` for the running Python is refused as well (see the end of `vet_address`).
_IPV4_RULES: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/32"), "unspecified address"),
    (_V4("0.0.0.0/8"), "reserved ('this network', 0.0.0.0/8)"),
    (_V4("10.0.0.0/8"), "private address (10.0.0.0/8)"),
    (_V4("100.64.0.0/10"), "carrier-grade NAT address (100.64.0.0/10)"),
    (_V4("127.0.0.0/8"), "loopback address"),
    (_V4("169.254.169.254/32"), "link-local cloud metadata address"),
    (_V4("169.254.0.0/16"), "link-local address (169.254.0.0/16)"),
    (_V4("172.16.0.0/12"), "private address (172.16.0.0/12)"),
    (_V4("192.0.0.0/24"), "reserved (IETF protocol assignments, 192.0.0.0/24)"),
    (_V4("192.0.2.0/24"), "documentation address (192.0.2.0/24)"),
    (_V4("192.88.99.0/24"), "reserved (6to4 relay anycast, 192.88.99.0/24)"),
    (_V4("192.168.0.0/16"), "private address (192.168.0.0/16)"),
    (_V4("198.18.0.0/15"), "benchmarking address (198.18.0.0/15)"),
    (_V4("198.51.100.0/24"), "documentation address (198.51.100.0/24)"),
    (_V4("203.0.113.0/24"), "documentation address (203.0.113.0/24)"),
    (_V4("224.0.0.0/4"), "multicast address"),
    (_V4("255.255.255.255/32"), "broadcast address"),
    (_V4("240.0.0.0/4"), "reserved (240.0.0.0/4)"),
)

_IPV6_RULES: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "unspecified address"),
    (_V6("::1/128"), "loopback address"),
    (_V6("64:ff9b:1::/48"), "local-use NAT64 address (64:ff9b:1::/48)"),
    (_V6("100::/64"), "discard-only address (100::/64)"),
    (_V6("2001:2::/48"), "benchmarking address (2001:2::/48)"),
    (_V6("2001:db8::/32"), "documentation address (2001:db8::/32)"),
    (_V6("3fff::/20"), "documentation address (3fff::/20)"),
    (_V6("5f00::/16"), "reserved (SRv6 SIDs, 5f00::/16)"),
    (_V6("fc00::/7"), "unique local address (fc00::/7)"),
    (_V6("fe80::/10"), "link-local address (fe80::/10)"),
    (_V6("fec0::/10"), "site-local address (fec0::/10)"),
    (_V6("ff00::/8"), "multicast address"),
)

# IPv6 forms that carry an IPv4 address in their low 32 bits.
_MAPPED = _V6("::ffff:0:0/96")  # IPv4-mapped
_TRANSLATED = _V6("::ffff:0:0:0/96")  # IPv4-translated (SIIT)
_COMPATIBLE = _V6("::/96")  # IPv4-compatible (deprecated)
_NAT64 = _V6("64:ff9b::/96")  # NAT64 well-known prefix
_TEREDO = _V6("2001::/32")
_SIXTOFOUR = _V6("2002::/16")
_GLOBAL_UNICAST = _V6("2000::/3")


def _low32(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)


def _vet_v4(ip: ipaddress.IPv4Address, allow_loopback: bool) -> str | None:
    for net, why in _IPV4_RULES:
        if ip in net:
            if allow_loopback and why == "loopback address":
                return None
            return why
    if not ip.is_global:
        return "not a globally routable address"
    return None


def _vet_embedded(form: str, inner: ipaddress.IPv4Address, allow_loopback: bool) -> str | None:
    why = _vet_v4(inner, allow_loopback)
    return None if why is None else f"{form} form of {inner}: {why}"


def _vet_v6(ip: ipaddress.IPv6Address, allow_loopback: bool) -> str | None:
    for net, why in _IPV6_RULES:
        if ip in net:
            if allow_loopback and why == "loopback address":
                return None
            return why
    if ip in _MAPPED:
        return _vet_embedded("IPv4-mapped", _low32(ip), allow_loopback)
    if ip in _TRANSLATED:
        return _vet_embedded("IPv4-translated", _low32(ip), allow_loopback)
    if ip in _COMPATIBLE:  # :: and ::1 were caught above
        return _vet_embedded("IPv4-compatible", _low32(ip), allow_loopback) or (
            "deprecated IPv4-compatible address"
        )
    if ip in _NAT64:
        return _vet_embedded("NAT64", _low32(ip), allow_loopback)
    if ip in _TEREDO:
        server, client = ip.teredo  # type: ignore[misc]  # never None inside 2001::/32
        return (
            _vet_embedded("Teredo (server)", server, False)
            or _vet_embedded("Teredo (client)", client, False)
            or "Teredo tunnel address"
        )
    if ip in _SIXTOFOUR:
        inner = ip.sixtofour
        assert inner is not None
        return _vet_embedded("6to4", inner, False)
    if ip not in _GLOBAL_UNICAST:
        return "reserved (outside global unicast 2000::/3)"
    if not ip.is_global:
        return "not a globally routable address"
    return None


def _parse_ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # a zone id never makes it better
    except ValueError:
        return None


def vet_address(ip: str, *, allow_loopback: bool = False) -> str | None:
    """None if `ip` may be connected to, else a short reason (one line) why not.

    Only globally routable unicast passes. IPv6 forms that embed an IPv4 address (mapped, translated,
    compatible, NAT64, 6to4, Teredo) are judged by the address they embed. `allow_loopback` (local
    development, see `check_transcript_url`) lets 127.0.0.0/8, ::1 and their mapped forms through;
    nothing else changes (link-local such as 169.254.169.254 stays refused)."""
    addr = _parse_ip(ip.strip()) if isinstance(ip, str) else None
    if addr is None:
        return "not an IP address"
    if isinstance(addr, ipaddress.IPv4Address):
        return _vet_v4(addr, allow_loopback)
    return _vet_v6(addr, allow_loopback)


@dataclass(frozen=True)
class ParsedURL:
    """A transcript URL that passed `check_transcript_url`, split into what the downloader needs.

    `host` is lowercase ASCII (IDNA-encoded, no brackets, no trailing dot); `ip` is set when the host
    is an IP literal; `target` is the raw path plus query to request (kept out of `repr`, it carries
    the signature); `local_dev` means the dev flag let this loopback target through."""

    scheme: str
    host: str
    port: int
    target: str = field(repr=False)
    ip: str | None = None
    local_dev: bool = False
    explicit_port: bool = False

    @property
    def host_header(self) -> str:
        """The Host header (and the name TLS verifies against), without the default port."""
        name = f"[{self.host}]" if self.ip and ":" in self.host else self.host
        return f"{name}:{self.port}" if self.explicit_port else name

    @property
    def display(self) -> str:
        """scheme://host[:port]/path — never the query string or userinfo; safe for messages/logs."""
        path = self.target.split("?", 1)[0]
        text = f"{self.scheme}://{self.host_header}{path}"
        return text if len(text) <= 160 else text[:157] + "..."


_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
FORBIDDEN_URL_CHARS = re.compile(r"[\x00-\x20\x7f\\]")  # whitespace, controls, backslash: never in a URL we use


class HostError(ValueError):
    """A URL's host is malformed; the message is the reason only (callers add what was refused)."""


def normalise_host(raw: str) -> tuple[str, str | None]:
    """(host, ip) — `host` lowercase ASCII without brackets or a trailing dot; `ip` set for an IP
    literal. Raises HostError with the reason."""
    if raw.startswith("[") and raw.endswith("]"):
        addr = _parse_ip(raw[1:-1])
        if not isinstance(addr, ipaddress.IPv6Address) or "%" in raw:
            raise HostError("malformed IPv6 host")
        return str(addr), str(addr)
    addr = _parse_ip(raw) if "%" not in raw else None
    if isinstance(addr, ipaddress.IPv4Address):
        return str(addr), str(addr)
    name = raw[:-1] if raw.endswith(".") else raw
    try:
        name = name.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise HostError("host is not a valid hostname") from None
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise HostError("host is not a valid hostname")
    return name, None


def host_of(netloc: str) -> tuple[str, str | None]:
    """A URL's netloc (credentials already refused) → `normalise_host` of its host, the port dropped.
    Raises HostError with the reason."""
    if netloc.startswith("["):
        end = netloc.find("]")
        raw = netloc[: end + 1] if end != -1 else netloc
    else:
        raw = netloc.rsplit(":", 1)[0] if ":" in netloc else netloc
    if not raw:
        raise HostError("no host")
    return normalise_host(raw)


def _host_of(netloc: str) -> tuple[str, str | None]:
    try:
        return host_of(netloc)
    except HostError as exc:
        raise UnsafeTranscriptURL(f"transcript URL refused: {exc}") from None


def is_loopback_target(host: str, ip: str | None) -> bool:
    """`localhost`, or a loopback IP literal (127/8, ::1, IPv4-mapped loopback): `common.urls.is_loopback`."""
    return is_loopback(ip if ip is not None else host)


def _check_expiry(expires_at: str | None, now: datetime) -> None:
    if expires_at is None:
        return
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    try:
        when = datetime.fromisoformat(expires_at.strip()) if isinstance(expires_at, str) else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise UnsafeTranscriptURL(
            "transcript URL refused: expires_at is not an ISO 8601 time with a timezone "
            "(e.g. 2025-01-31T12:00:00Z); ask Smartnumbers to resend the event"
        )
    if when <= now:
        raise UnsafeTranscriptURL(
            f"transcript URL refused: it expired at {when.isoformat()}; ask Smartnumbers to resend "
            "the event for a fresh link"
        )


def check_transcript_url(
    url: str,
    *,
    now: datetime,
    expires_at: str | None,
    allowed_hosts: frozenset[str] = frozenset(),
    allow_insecure_local: bool = False,
) -> ParsedURL:
    """Check a transcript URL against the download rules; return it parsed or raise
    UnsafeTranscriptURL (one-line message, never the query string).

    - at most `MAX_URL_CHARS` characters;
    - https only, on the default port (443), no userinfo, no whitespace/control characters;
    - with `allow_insecure_local`: a loopback IP literal or `localhost` may also use http and any
      port (the downloader then lets loopback addresses through vetting, and only loopback);
    - `allowed_hosts`, when not empty: the host must be one of them (exact, case-insensitive);
    - `expires_at` (ISO 8601 with a timezone, `Z` accepted): refused when not after `now`, or
      when malformed.

    Address vetting of what the host resolves to is the downloader's job (`vet_address`)."""
    if not isinstance(url, str) or not url:
        raise UnsafeTranscriptURL("transcript URL refused: empty or not a string")
    if len(url) > MAX_URL_CHARS:
        raise UnsafeTranscriptURL(
            f"transcript URL refused: it is {len(url)} characters long, more than {MAX_URL_CHARS}; "
            "ask Smartnumbers to resend the event"
        )
    if FORBIDDEN_URL_CHARS.search(url):
        raise UnsafeTranscriptURL("transcript URL refused: contains whitespace, control characters or '\\'")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UnsafeTranscriptURL("transcript URL refused: malformed URL or port") from None
    scheme = parts.scheme.lower()
    netloc = parts.netloc
    if scheme not in ("https", "http") or not netloc:
        raise UnsafeTranscriptURL("transcript URL refused: only https:// URLs are accepted")
    if "@" in netloc:
        raise UnsafeTranscriptURL(
            "transcript URL refused: it contains credentials (user:password@); use a presigned URL instead"
        )
    host, ip = _host_of(netloc)

    local_dev = allow_insecure_local and is_loopback_target(host, ip)
    explicit_port = port is not None and port != {"https": 443, "http": 80}[scheme]
    if scheme == "http" and not local_dev:
        raise UnsafeTranscriptURL(
            "transcript URL refused: only https:// URLs are accepted"
            + (
                ""
                if allow_insecure_local
                else " (http:// needs the local-development flag and a loopback host)"
            )
        )
    if explicit_port and not local_dev:
        raise UnsafeTranscriptURL(
            f"transcript URL refused: port {port} is not allowed; only the default https port (443)"
        )
    wanted = {h.strip().lower().rstrip(".") for h in allowed_hosts if h.strip()}
    if wanted and host not in wanted:
        raise UnsafeTranscriptURL(
            f"transcript URL refused: host {host} is not in SMARTNUMBERS_ALLOWED_TRANSCRIPT_HOSTS"
        )
    _check_expiry(expires_at, now)

    path = parts.path or "/"
    if not path.startswith("/"):
        raise UnsafeTranscriptURL("transcript URL refused: malformed path")
    target = path + (f"?{parts.query}" if parts.query else "")
    return ParsedURL(
        scheme=scheme,
        host=host,
        port=port if port is not None else {"https": 443, "http": 80}[scheme],
        target=target,
        ip=ip,
        local_dev=local_dev,
        explicit_port=explicit_port,
    )
