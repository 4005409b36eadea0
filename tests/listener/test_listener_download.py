"""SSRF-guarded transcript download: the pure rules (`listener.addresses`) and the real download
(`listener.download`) against a loopback HTTPS server whose certificate is made here, for a name
(`transcripts.test`) that only the injected resolver knows."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
import tracemalloc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import listener.download as dl
from listener.addresses import UnsafeTranscriptURL, check_transcript_url, vet_address
from listener.download import TranscriptDownloadError, download_transcript
from tests.support.clock import VirtualClock

NOW = dt.datetime(2025, 6, 1, 12, 0, tzinfo=dt.UTC)
HOST = "transcripts.test"
SECRET = "X-Amz-Signature=deadbeefSECRET"
PATH = f"/calls/42.md?{SECRET}"
URL = f"https://{HOST}{PATH}"


# --- certificates ---------------------------------------------------------------------------------


@dataclass
class PKI:
    ca_pem: bytes
    good: tuple[bytes, bytes]  # (cert PEM, key PEM) for transcripts.test
    other: tuple[bytes, bytes]  # for other.test, and IP 127.0.0.1 / 127.0.0.2


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _make_pki() -> PKI:
    start = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    end = start + dt.timedelta(days=7)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("Switchboard test CA"))
        .issuer_name(_name("Switchboard test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, sans: list[x509.GeneralName]) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem

    return PKI(
        ca_pem=ca.public_bytes(serialization.Encoding.PEM),
        good=leaf(HOST, [x509.DNSName(HOST)]),
        # Valid for the IP we really connect to: if verification were against the IP instead of
        # the real name, this certificate would be accepted.
        other=leaf(
            "other.test",
            [
                x509.DNSName("other.test"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("127.0.0.2")),
            ],
        ),
    )


@pytest.fixture(scope="module")
def pki() -> PKI:
    return _make_pki()


@pytest.fixture
def client_ctx(pki: PKI) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=pki.ca_pem.decode())


def _server_ctx(cert: tuple[bytes, bytes], tmp_path, seen_sni: list[str | None]) -> ssl.SSLContext:
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert[0])
    key_file.write_bytes(cert[1])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_file, key_file)
    ctx.sni_callback = lambda _sock, name, _ctx: seen_sni.append(name)
    return ctx


# --- a small HTTP/1.1 server on loopback ------------------------------------------------------------


def ok(body: bytes, *, declared: bool = True) -> bytes:
    if declared:
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
    chunked = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 1000]), body[i : i + 1000]) for i in range(0, len(body), 1000)
    )
    return (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked + b"0\r\n\r\n"
    )


def status(code: int, extra: str = "") -> bytes:
    return f"HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n{extra}\r\n".encode()


@dataclass
class Seen:
    request_line: str
    headers: dict[str, str]
    local: str


@dataclass
class Server:
    """`reply` is written after the request; `hang` (when set) holds the answer until it is set;
    `respond(writer)` (when set) writes the answer itself — a trickle. `active` counts the requests
    being answered now; `wait_requests(n)` waits (on a condition) until n requests have arrived."""

    reply: bytes = field(default_factory=lambda: ok(b"# transcript\n"))
    requests: list[Seen] = field(default_factory=list)
    sni: list[str | None] = field(default_factory=list)
    hang: asyncio.Event | None = None
    respond: Callable[[asyncio.StreamWriter], Awaitable[None]] | None = None
    port: int = 0
    active: int = 0
    most_active: int = 0
    _server: asyncio.AbstractServer | None = None
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def start(self, host: str, ssl_ctx: ssl.SSLContext | None, port: int = 0) -> Server:
        self._server = await asyncio.start_server(self._handle, host, port, ssl=ssl_ctx)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
            }
            self.requests.append(Seen(lines[0], headers, writer.get_extra_info("sockname")[0]))
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            async with self._changed:
                self._changed.notify_all()
            try:
                if self.hang is not None:
                    await self.hang.wait()
                if self.respond is not None:
                    await self.respond(writer)
                else:
                    writer.write(self.reply)
                    await writer.drain()
            finally:
                self.active -= 1
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, ssl.SSLError):
                pass

    async def wait_requests(self, n: int) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.requests) >= n), 5)

    async def stop(self) -> None:
        if self.hang is not None:
            self.hang.set()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


@pytest.fixture
async def tls_server(pki, tmp_path):
    server = Server()
    await server.start("127.0.0.1", _server_ctx(pki.good, tmp_path, server.sni))
    yield server
    await server.stop()


class FakeResolver:
    def __init__(self, *answers: list[str]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def __call__(self, host: str) -> list[str]:
        self.calls.append(host)
        return list(self.answers[min(len(self.calls), len(self.answers)) - 1])


def vet_allowing(*allowed: str):
    """The real rules, except exactly these addresses (the test server's) are admitted."""

    def vet(ip: str, *, allow_loopback: bool = False) -> str | None:
        return None if ip in allowed else vet_address(ip, allow_loopback=allow_loopback)

    return vet


def assert_clean(err: BaseException) -> None:
    text = str(err)
    assert "\n" not in text and "SECRET" not in text and "deadbeef" not in text, text


# --- pure rules: vet_address ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "ip", ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"]
)
def test_public_addresses_pass(ip):
    assert vet_address(ip) is None


@pytest.mark.parametrize(
    ("ip", "why"),
    [
        ("10.0.0.5", "private"),
        ("172.16.3.4", "private"),
        ("192.168.1.1", "private"),
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("169.254.169.254", "metadata"),
        ("169.254.1.1", "link-local"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("100.127.255.254", "carrier-grade NAT"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "broadcast"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "reserved"),
        ("198.18.0.1", "benchmarking"),
        ("198.19.255.1", "benchmarking"),
        ("192.0.2.10", "documentation"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("192.0.0.8", "reserved"),
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("fd12:3456::1", "unique local"),
        ("fc00::1", "unique local"),
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "documentation"),
        ("2001:2::1", "benchmarking"),
        ("100::1", "discard"),
        ("::ffff:10.0.0.1", "IPv4-mapped form of 10.0.0.1: private"),
        ("::ffff:127.0.0.1", "IPv4-mapped form of 127.0.0.1: loopback"),
        ("::ffff:169.254.169.254", "metadata"),
        ("::ffff:100.64.0.1", "carrier-grade NAT"),
        ("::10.0.0.1", "IPv4-compatible form of 10.0.0.1"),
        ("::8.8.8.8", "IPv4-compatible"),
        ("::ffff:0:a00:1", "IPv4-translated form of 10.0.0.1"),
        ("64:ff9b::a9fe:a9fe", "NAT64 form of 169.254.169.254"),
        ("64:ff9b::7f00:1", "NAT64 form of 127.0.0.1"),
        ("64:ff9b:1::1", "NAT64"),
        ("2002:0a00:0001::1", "6to4 form of 10.0.0.1"),
        ("2002:a9fe:a9fe::1", "6to4 form of 169.254.169.254"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
        ("2001:0:a00:1::1", "Teredo (server) form of 10.0.0.1"),
        ("3fff::1", "documentation"),
        ("4000::1", "reserved"),
        ("not-an-ip", "not an IP"),
        ("010.0.0.1", "not an IP"),
        ("", "not an IP"),
    ],
)
def test_non_global_addresses_are_refused(ip, why):
    reason = vet_address(ip)
    assert reason is not None and why in reason, reason
    assert "\n" not in reason


def test_allow_loopback_admits_only_loopback():
    for ip in ("127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"):
        assert vet_address(ip, allow_loopback=True) is None
    for ip in ("169.254.169.254", "::ffff:169.254.169.254", "10.0.0.5", "fe80::1", "100.64.0.1", "0.0.0.0"):
        assert vet_address(ip, allow_loopback=True) is not None


# --- pure rules: check_transcript_url -------------------------------------------------------------


def check(url: str, **kw):
    kw.setdefault("now", NOW)
    kw.setdefault("expires_at", None)
    return check_transcript_url(url, **kw)


def test_a_plain_https_url_passes_and_keeps_its_target():
    parsed = check(URL, expires_at="2025-06-01T12:05:00Z")
    assert (parsed.scheme, parsed.host, parsed.port, parsed.ip) == ("https", HOST, 443, None)
    assert parsed.target == PATH and parsed.host_header == HOST
    assert "SECRET" not in repr(parsed) and "SECRET" not in parsed.display
    assert check("https://Transcripts.TEST.:443/x").host == HOST
    assert check("https://transcripts.test").target == "/"


@pytest.mark.parametrize(
    ("url", "kw", "why"),
    [
        (f"http://{HOST}{PATH}", {}, "only https"),
        (f"ftp://{HOST}{PATH}", {}, "only https"),
        (f"https://{HOST}:8443{PATH}", {}, "port 8443"),
        (f"https://user:hunter2@{HOST}{PATH}", {}, "credentials"),
        (f"https://user@{HOST}{PATH}", {}, "credentials"),
        (f"https://:@{HOST}{PATH}", {}, "credentials"),
        (f"https://{HOST}{PATH}", {"expires_at": "2025-06-01T11:59:59Z"}, "expired"),
        (f"https://{HOST}{PATH}", {"expires_at": "2025-06-01T12:00:00+00:00"}, "expired"),
        (f"https://{HOST}{PATH}", {"expires_at": "tomorrow"}, "not an ISO 8601"),
        (f"https://{HOST}{PATH}", {"expires_at": "2025-06-02T12:00:00"}, "timezone"),
        (f"https://{HOST}{PATH}", {"expires_at": ""}, "not an ISO 8601"),
        (f"https://{HOST}{PATH}", {"allowed_hosts": frozenset({"cdn.example.com"})}, "not in"),
        (f"https://sub.{HOST}{PATH}", {"allowed_hosts": frozenset({HOST})}, "not in"),
        (f"https://{HOST} {PATH}", {}, "whitespace"),
        (f"https://{HOST}/a\nb?{SECRET}", {}, "control"),
        (f"https://{HOST}\\@evil.test{PATH}", {}, "'\\'"),
        (f"https://ho%73t.test{PATH}", {}, "not a valid hostname"),
        (f"https://*.test{PATH}", {}, "not a valid hostname"),
        (f"https:///{PATH}", {}, "only https"),
        (f"http://169.254.169.254/latest/meta-data?{SECRET}", {"allow_insecure_local": True}, "only https"),
        (f"http://{HOST}{PATH}", {"allow_insecure_local": True}, "only https"),
        (f"http://10.0.0.5{PATH}", {"allow_insecure_local": True}, "only https"),
        (f"https://{HOST}:8443{PATH}", {"allow_insecure_local": True}, "port 8443"),
    ],
)
def test_refused_urls(url, kw, why):
    with pytest.raises(UnsafeTranscriptURL) as exc:
        check(url, **kw)
    assert why in str(exc.value), str(exc.value)
    assert_clean(exc.value)
    assert "hunter2" not in str(exc.value)


def test_allow_list_is_exact_and_case_insensitive():
    assert check(URL, allowed_hosts=frozenset({"TRANSCRIPTS.test"})).host == HOST
    assert check(URL, allowed_hosts=frozenset({"transcripts.test.", "x.test"})).host == HOST


def test_expiry_in_the_future_passes():
    assert check(URL, expires_at="2025-06-01T12:00:01Z").host == HOST
    assert check(URL, expires_at="2025-06-01T14:00:01+02:00").host == HOST


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8000/t", "http://localhost:8000/t", "http://[::1]:8000/t", "https://127.0.0.1:9/t"],
)
def test_dev_flag_admits_http_and_ports_only_for_loopback(url):
    parsed = check(url, allow_insecure_local=True)
    assert parsed.local_dev and parsed.port in (8000, 9)
    with pytest.raises(UnsafeTranscriptURL):
        check(url)


# --- real downloads on loopback -------------------------------------------------------------------


async def fetch(server: Server, client_ctx, url: str = URL, **kw) -> bytes:
    kw.setdefault("resolver", FakeResolver(["127.0.0.1"]))
    kw.setdefault("vet", vet_allowing("127.0.0.1"))
    kw.setdefault("now", NOW)
    return await download_transcript(url, verify=client_ctx, connect_port=server.port, **kw)


async def test_normal_download_keeps_host_and_sni(tls_server, client_ctx):
    tls_server.reply = ok(b"# Call 42\n**TO:** hello\n")
    resolver = FakeResolver(["127.0.0.1"])
    body = await fetch(tls_server, client_ctx, resolver=resolver, expires_at="2025-06-01T13:00:00Z")
    assert body == b"# Call 42\n**TO:** hello\n"
    assert resolver.calls == [HOST]
    [seen] = tls_server.requests
    assert seen.request_line == f"GET {PATH} HTTP/1.1"
    assert seen.headers["host"] == HOST
    assert tls_server.sni == [HOST]
    assert "authorization" not in seen.headers and "proxy-authorization" not in seen.headers


@pytest.mark.parametrize(
    ("answers", "why"),
    [
        (["10.0.0.5"], "private"),
        (["::ffff:10.0.0.1"], "IPv4-mapped"),
        (["100.64.0.1"], "carrier-grade NAT"),
        (["169.254.169.254"], "metadata"),
        (["127.0.0.1", "10.0.0.5"], "10.0.0.5"),  # one good answer does not excuse a bad one
        (["fd00::5", "127.0.0.1"], "unique local"),
    ],
)
async def test_bad_answers_are_refused_before_connecting(tls_server, client_ctx, answers, why):
    with pytest.raises(TranscriptDownloadError) as exc:
        await fetch(tls_server, client_ctx, resolver=FakeResolver(answers))
    assert exc.value.refused and why in str(exc.value)
    assert_clean(exc.value)
    assert tls_server.requests == [] and tls_server.sni == []


async def test_loopback_is_refused_without_the_dev_flag(tls_server, client_ctx):
    for url, resolver in ((URL, FakeResolver(["127.0.0.1"])), (f"https://127.0.0.1{PATH}", FakeResolver())):
        with pytest.raises(TranscriptDownloadError) as exc:
            await fetch(tls_server, client_ctx, url, resolver=resolver, vet=vet_address)
        assert exc.value.refused and "loopback" in str(exc.value)
        assert_clean(exc.value)
    # The dev flag does not let a non-loopback *name* resolve to loopback either.
    with pytest.raises(TranscriptDownloadError, match="loopback"):
        await fetch(tls_server, client_ctx, vet=vet_address, allow_insecure_local=True)
    assert tls_server.requests == []


async def test_metadata_address_is_refused_even_with_the_dev_flag(tls_server, client_ctx):
    cases = [
        (f"http://169.254.169.254/latest/meta-data?{SECRET}", FakeResolver()),
        (f"http://localhost{PATH}", FakeResolver(["127.0.0.1", "169.254.169.254"])),
        (f"https://localhost{PATH}", FakeResolver(["::ffff:169.254.169.254"])),
        (URL, FakeResolver(["169.254.169.254"])),
    ]
    for url, resolver in cases:
        with pytest.raises(TranscriptDownloadError) as exc:
            await fetch(
                tls_server, client_ctx, url, resolver=resolver, vet=vet_address, allow_insecure_local=True
            )
        assert exc.value.refused
        assert_clean(exc.value)
    assert tls_server.requests == []


async def test_dev_flag_allows_plain_http_to_loopback():
    server = await Server(reply=ok(b"dev transcript")).start("127.0.0.1", None)
    try:
        url = f"http://127.0.0.1:{server.port}/t?{SECRET}"
        assert await download_transcript(url, allow_insecure_local=True, now=NOW) == b"dev transcript"
        resolver = FakeResolver(["127.0.0.1"])
        url = f"http://localhost:{server.port}/t"
        assert (
            await download_transcript(url, allow_insecure_local=True, resolver=resolver) == b"dev transcript"
        )
        assert resolver.calls == ["localhost"]
        assert [s.headers["host"] for s in server.requests] == [
            f"127.0.0.1:{server.port}",
            f"localhost:{server.port}",
        ]
        with pytest.raises(TranscriptDownloadError, match="only https"):
            await download_transcript(url, resolver=resolver)
    finally:
        await server.stop()


async def test_redirect_is_refused_and_not_followed(tls_server, client_ctx):
    tls_server.reply = status(302, f"Location: /elsewhere?{SECRET}\r\n")  # same origin: followable
    with pytest.raises(TranscriptDownloadError) as exc:
        await fetch(tls_server, client_ctx)
    assert exc.value.refused and exc.value.status == 302 and "redirect" in str(exc.value)
    assert_clean(exc.value)
    assert len(tls_server.requests) == 1


async def test_dns_answer_that_changes_is_not_asked_twice(pki, tmp_path, client_ctx):
    # 127.0.0.2 stands in for the public address the name had at check time; 127.0.0.1 is what a
    # rebinding attacker's DNS would answer next. A trap listens there on the same port.
    # The trap binds first: the port the OS gives on 127.0.0.1 is free there (busy machines and parallel
    # tests use 127.0.0.1, hardly ever 127.0.0.2).
    trap = Server(reply=ok(b"internal secrets"))
    await trap.start("127.0.0.1", _server_ctx(pki.good, tmp_path, trap.sni))
    good = Server(reply=ok(b"the real transcript"))
    await good.start("127.0.0.2", _server_ctx(pki.good, tmp_path, good.sni), port=trap.port)
    try:
        resolver = FakeResolver(["127.0.0.2"], ["127.0.0.1"])
        body = await download_transcript(
            URL,
            resolver=resolver,
            vet=vet_allowing("127.0.0.2"),
            verify=client_ctx,
            connect_port=good.port,
            now=NOW,
        )
        assert body == b"the real transcript"
        assert resolver.calls == [HOST]
        assert [s.local for s in good.requests] == ["127.0.0.2"] and trap.requests == []
    finally:
        await good.stop()
        await trap.stop()


async def test_expired_url_is_refused_before_resolving(tls_server, client_ctx):
    resolver = FakeResolver(["127.0.0.1"])
    with pytest.raises(TranscriptDownloadError, match="expired") as exc:
        await fetch(tls_server, client_ctx, resolver=resolver, expires_at="2025-05-31T12:00:00Z")
    assert exc.value.refused and resolver.calls == [] and tls_server.requests == []
    assert_clean(exc.value)


async def test_credentials_in_url_are_refused(tls_server, client_ctx):
    resolver = FakeResolver(["127.0.0.1"])
    with pytest.raises(TranscriptDownloadError, match="credentials") as exc:
        await fetch(tls_server, client_ctx, f"https://admin:hunter2@{HOST}{PATH}", resolver=resolver)
    assert "hunter2" not in str(exc.value) and "admin" not in str(exc.value)
    assert resolver.calls == [] and tls_server.requests == []


async def test_http_without_the_flag_is_refused(tls_server, client_ctx):
    with pytest.raises(TranscriptDownloadError, match="only https") as exc:
        await fetch(tls_server, client_ctx, f"http://{HOST}{PATH}")
    assert exc.value.refused and tls_server.requests == []


async def test_allow_list_applies_to_downloads(tls_server, client_ctx):
    with pytest.raises(TranscriptDownloadError, match="not in SMARTNUMBERS_ALLOWED_TRANSCRIPT_HOSTS"):
        await fetch(tls_server, client_ctx, allowed_hosts=frozenset({"cdn.example.com"}))
    assert await fetch(tls_server, client_ctx, allowed_hosts=frozenset({HOST.upper()}))


async def test_proxy_environment_is_ignored(tls_server, client_ctx, monkeypatch):
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert await fetch(tls_server, client_ctx) == b"# transcript\n"
    assert len(tls_server.requests) == 1 and tls_server.sni == [HOST]


@pytest.mark.parametrize("declared", [True, False])
async def test_size_cap_stops_the_download(tls_server, client_ctx, declared):
    tls_server.reply = ok(b"x" * 50_000, declared=declared)
    with pytest.raises(TranscriptDownloadError, match="larger than 10000 bytes") as exc:
        await fetch(tls_server, client_ctx, max_bytes=10_000)
    assert_clean(exc.value)


async def test_size_cap_admits_exactly_the_limit(tls_server, client_ctx):
    tls_server.reply = ok(b"y" * 3000, declared=False)
    assert await fetch(tls_server, client_ctx, max_bytes=3000) == b"y" * 3000


async def test_an_undeclared_body_one_byte_over_the_cap_is_refused_at_the_chunk_that_crosses_it(tls_server, client_ctx):
    tls_server.reply = ok(b"y" * 3001, declared=False)  # 1000-byte chunks, then the one byte over
    with pytest.raises(TranscriptDownloadError, match="larger than 3000 bytes") as exc:
        await fetch(tls_server, client_ctx, max_bytes=3000)
    assert_clean(exc.value)


async def test_certificate_for_another_name_is_rejected(pki, tmp_path, client_ctx):
    server = Server()
    await server.start("127.0.0.1", _server_ctx(pki.other, tmp_path, server.sni))
    try:
        with pytest.raises(TranscriptDownloadError, match="certificate") as exc:
            await fetch(server, client_ctx)
        assert exc.value.refused
        assert_clean(exc.value)
        assert server.sni == [HOST] and server.requests == []
        # The same server and context are fine for the name the certificate is for.
        body = await fetch(server, client_ctx, f"https://other.test{PATH}")
        assert body == b"# transcript\n"
    finally:
        await server.stop()


async def test_certificate_from_an_unknown_ca_is_rejected(tls_server):
    with pytest.raises(TranscriptDownloadError, match="certificate"):
        await fetch(tls_server, ssl.create_default_context())


def test_a_context_that_skips_hostname_checks_is_not_accepted(client_ctx):
    client_ctx.check_hostname = False
    with pytest.raises(ValueError, match="check_hostname"):
        asyncio.run(download_transcript(URL, verify=client_ctx, resolver=FakeResolver(["8.8.8.8"])))


@pytest.mark.parametrize(("code", "retryable"), [(404, False), (403, False), (503, True), (429, True)])
async def test_non_2xx_is_an_error_with_the_status(tls_server, client_ctx, code, retryable):
    tls_server.reply = status(code)
    with pytest.raises(TranscriptDownloadError, match=f"HTTP {code}") as exc:
        await fetch(tls_server, client_ctx)
    assert exc.value.status == code and exc.value.retryable is retryable and not exc.value.refused
    assert_clean(exc.value)


async def test_resolver_failure_is_retryable(client_ctx):
    async def broken(host: str) -> list[str]:
        raise OSError("Name or service not known")

    with pytest.raises(TranscriptDownloadError, match="could not resolve") as exc:
        await download_transcript(URL, resolver=broken, verify=client_ctx)
    assert exc.value.retryable
    with pytest.raises(TranscriptDownloadError, match="no addresses"):
        await download_transcript(URL, resolver=FakeResolver([]), verify=client_ctx)


async def test_a_server_that_never_answers_times_out(tls_server, client_ctx):
    tls_server.hang = asyncio.Event()
    with pytest.raises(TranscriptDownloadError, match="timed out") as exc:
        await fetch(tls_server, client_ctx, timeout_s=0.3)
    assert exc.value.retryable
    assert_clean(exc.value)


async def test_default_resolver_is_used_for_localhost():
    server = await Server(reply=ok(b"via getaddrinfo")).start("127.0.0.1", None)
    try:
        url = f"http://localhost:{server.port}/t"
        try:
            body = await download_transcript(url, allow_insecure_local=True)
        except TranscriptDownloadError as exc:  # localhost may also resolve to ::1 first, unserved
            pytest.skip(f"localhost not served on its first address here: {exc}")
        assert body == b"via getaddrinfo"
    finally:
        await server.stop()


# --- limits: size, total time, concurrency, URL length ---------------------------------------------
# (`dl.` names, not imports: each of these tests fails on its own when a limit is missing)

MIB = 1024 * 1024


def downloader(server: Server, client_ctx, **kw) -> dl.TranscriptDownloader:
    kw.setdefault("resolver", FakeResolver(["127.0.0.1"]))
    kw.setdefault("vet", vet_allowing("127.0.0.1"))
    return dl.TranscriptDownloader(verify=client_ctx, connect_port=server.port, **kw)


def test_the_size_cap_is_20_mib_by_default_and_must_be_a_positive_size():
    assert dl.DEFAULT_MAX_TRANSCRIPT_BYTES == 20 * MIB
    assert dl.TranscriptDownloader().max_bytes == 20 * MIB
    for bad in (0, -1, None, 1.5, True):
        with pytest.raises((ValueError, TypeError)):
            dl.TranscriptDownloader(max_bytes=bad)
    assert dl.TranscriptDownloader().max_concurrent < 4  # below the stream client's default concurrency


async def test_a_body_declared_larger_than_the_default_cap_is_refused_before_it_is_read(tls_server, client_ctx):
    declared = 20 * MIB + 1
    tls_server.reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % declared + b"x" * 100
    with pytest.raises(TranscriptDownloadError, match=f"larger than {20 * MIB} bytes") as exc:
        await fetch(tls_server, client_ctx)  # no max_bytes given: the default applies
    assert exc.value.refused and "SMARTNUMBERS_MAX_TRANSCRIPT_BYTES" in str(exc.value)
    assert_clean(exc.value)


async def test_an_undeclared_body_is_counted_and_stopped_at_the_downloaders_cap(tls_server, client_ctx):
    tls_server.reply = ok(b"z" * 30_000, declared=False)
    fetcher = downloader(tls_server, client_ctx, max_bytes=20_000)
    with pytest.raises(TranscriptDownloadError, match="larger than 20000 bytes") as exc:
        await fetcher(URL, None)
    assert exc.value.refused
    tls_server.reply = ok(b"z" * 20_000, declared=False)
    assert await fetcher(URL, None) == b"z" * 20_000  # exactly the cap is fine


async def test_a_download_holds_one_copy_of_its_body(tls_server, client_ctx):
    body = bytes(range(256)) * (2 * MIB // 256)

    async def in_slices(writer: asyncio.StreamWriter) -> None:  # small writes: the server buffers little
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
        view = memoryview(body)
        for i in range(0, len(body), 64 * 1024):
            writer.write(view[i : i + 64 * 1024])
            await writer.drain()

    tls_server.respond = in_slices
    await fetch(tls_server, client_ctx)  # warm up: TLS and httpx's one-time allocations
    tracemalloc.start()
    try:
        got = await fetch(tls_server, client_ctx, max_bytes=2 * MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == body
    assert peak < 1.5 * len(body), f"peak {peak / len(body):.2f}x the body"


async def test_a_host_that_trickles_is_cut_off_at_the_total_deadline(tls_server, client_ctx):
    clock = VirtualClock()

    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\nConnection: close\r\n\r\n")
        for _ in range(400):  # each byte comes half a second after the last: no single read is slow
            if writer.is_closing():
                return
            writer.write(b"x")
            await writer.drain()
            clock.now += 0.5
            await asyncio.sleep(0)

    tls_server.respond = trickle
    with pytest.raises(TranscriptDownloadError, match="timed out after 30s") as exc:
        await fetch(tls_server, client_ctx, timeout_s=30, clock=clock)
    assert exc.value.retryable and not exc.value.refused
    assert 30 <= clock.now < 200  # stopped at the deadline, not at the end of the body
    assert_clean(exc.value)


async def test_a_download_that_finds_every_slot_taken_fails_at_once_as_retryable(tls_server, client_ctx):
    tls_server.hang = asyncio.Event()
    fetcher = downloader(tls_server, client_ctx, max_concurrent=2, queue_s=0)
    slow = [asyncio.create_task(fetcher(URL, None)) for _ in range(2)]
    try:
        await tls_server.wait_requests(2)
        assert fetcher.running == 2
        with pytest.raises(TranscriptDownloadError, match="2 downloads are already running") as exc:
            await fetcher(URL, None)
        assert exc.value.retryable and not exc.value.refused
        assert len(tls_server.requests) == 2  # the third never connected
        assert_clean(exc.value)
        # A refused link is refused as such, without waiting for a slot.
        with pytest.raises(TranscriptDownloadError, match="only https"):
            await fetcher(f"http://{HOST}{PATH}", None)
        tls_server.hang.set()
        assert await asyncio.gather(*slow) == [b"# transcript\n"] * 2
    finally:
        tls_server.hang.set()
        await asyncio.gather(*slow, return_exceptions=True)
    assert fetcher.running == 0 and await fetcher(URL, None) == b"# transcript\n"  # the slots came back


async def test_a_download_waits_up_to_queue_s_for_a_free_slot(tls_server, client_ctx):
    tls_server.hang = asyncio.Event()
    fetcher = downloader(tls_server, client_ctx, max_concurrent=1, queue_s=60)
    first = asyncio.create_task(fetcher(URL, None))
    second = asyncio.create_task(fetcher(URL, None))
    try:
        await tls_server.wait_requests(1)
        tls_server.hang.set()
        assert await asyncio.gather(first, second) == [b"# transcript\n"] * 2
    finally:
        tls_server.hang.set()
        await asyncio.gather(first, second, return_exceptions=True)
    assert len(tls_server.requests) == 2 and tls_server.most_active == 1  # one at a time


async def test_an_overlong_url_is_a_one_line_download_refusal(tls_server, client_ctx):
    long_url = f"https://{HOST}/calls/42.md?{SECRET}&pad={'a' * 100_000}"
    resolver = FakeResolver(["127.0.0.1"])
    with pytest.raises(TranscriptDownloadError, match="characters long") as exc:
        await fetch(tls_server, client_ctx, long_url, resolver=resolver)
    assert exc.value.refused and resolver.calls == [] and tls_server.requests == []
    assert_clean(exc.value)
    assert len(str(exc.value)) < 300
    with pytest.raises(UnsafeTranscriptURL, match="characters long"):
        check(long_url)


async def test_any_url_httpx_refuses_is_a_download_refusal_not_an_escaping_error(tls_server, client_ctx, monkeypatch):
    import listener.addresses as addresses

    monkeypatch.setattr(addresses, "MAX_URL_CHARS", 10**7, raising=False)  # let the URL reach httpx's own check
    long_url = f"https://{HOST}/calls/42.md?{SECRET}&pad={'a' * 100_000}"
    with pytest.raises(TranscriptDownloadError, match="not a URL the HTTP client accepts") as exc:
        await fetch(tls_server, client_ctx, long_url)
    assert exc.value.refused
    assert_clean(exc.value)
    assert tls_server.requests == []


# --- the same limits seen from the stream: acks, and room for new events -------------------------


@pytest.fixture
async def make_listener(tls_server, tmp_path):
    """`await make_listener(download)`: the stream client over the real pipeline (a SQLite store),
    downloading with `download`, up to 3 events at once; returns the fake Smartnumbers server."""
    from contextlib import AsyncExitStack

    from bot.services import LISTENER_MIGRATIONS
    from common.store import open_store
    from listener.archive import Archive
    from listener.pipeline import TranscriptPipeline
    from listener.stream import StreamClient
    from tests.support.fake_smartnumbers import FakeSmartnumbers

    stack = AsyncExitStack()

    async def make(download):
        store = await open_store(tmp_path, LISTENER_MIGRATIONS)
        stack.push_async_callback(store.close)
        pipeline = TranscriptPipeline(Archive(store), download=download, jobs=None, agent_name="Ares")
        fake = await stack.enter_async_context(FakeSmartnumbers(key="k"))
        client = StreamClient(fake.url, key=lambda: "k", allowed_hosts=frozenset({"127.0.0.1"}),
                              allow_insecure_local=True, handle=pipeline.handle, concurrency=3,
                              jitter=lambda d: d, sleep=lambda d: asyncio.Event().wait())
        stack.push_async_callback(client.stop)
        await client.start()
        await fake.wait_connection(1)
        return fake

    try:
        yield make
    finally:
        if tls_server.hang is not None:
            tls_server.hang.set()
        await stack.aclose()


def url_event(event_id: str, url: str = URL) -> dict:
    from tests.support.fake_smartnumbers import transcript_url_event

    return transcript_url_event(event_id, url=url)


async def test_slow_transcript_hosts_leave_room_for_new_events(make_listener, tls_server, client_ctx):
    fetcher = downloader(tls_server, client_ctx, max_concurrent=2, queue_s=0)
    fake = await make_listener(fetcher)
    tls_server.hang = asyncio.Event()  # the host takes the request, then says nothing
    tls_server.reply = ok(b"1\n**TO**: See you on Friday.\n")
    await fake.send_event(url_event("evt_slow_1"))
    await fake.send_event(url_event("evt_slow_2"))
    await tls_server.wait_requests(2)

    await fake.send_event(url_event("evt_slow_3"))  # every download slot is taken: it fails at once
    busy = await fake.ack_for("evt_slow_3")
    assert busy["success"] is False and busy["errors"][0]["stage"] == "download"
    assert "already running" in busy["errors"][0]["message"] and len(tls_server.requests) == 2

    await fake.send_event({"event_id": "evt_direct", "conversation_id": "call_direct",
                           "turns": [{"speaker": "TO", "text": "hello"}]})
    direct = await fake.ack_for("evt_direct")
    assert direct["success"] is True and direct["stages"]["archive"] == "ok"
    assert fake.acks_for("evt_slow_1") == [] and fetcher.running == 2  # still downloading meanwhile

    tls_server.hang.set()
    for event_id in ("evt_slow_1", "evt_slow_2"):
        ack = await fake.ack_for(event_id)
        assert ack["success"] is True, (ack["stages"], ack["errors"])
    fake.assert_clean()


async def test_an_overlong_url_is_acked_as_a_download_error_on_one_line(make_listener, tls_server, client_ctx,
                                                                        caplog):
    async def download(url: str, expires_at: str | None) -> bytes:
        return await fetch(tls_server, client_ctx, url, expires_at=expires_at)

    fake = await make_listener(download)
    await fake.send_event(url_event("evt_long", f"https://{HOST}/calls/42.md?{SECRET}&pad={'a' * 100_000}"))
    ack = await fake.ack_for("evt_long")
    assert ack["success"] is False and ack["stages"] == {"download": "error"}
    [error] = ack["errors"]
    assert error["stage"] == "download" and "characters long" in error["message"]
    assert "\n" not in error["message"] and "SECRET" not in error["message"]
    assert "Traceback" not in caplog.text and "InvalidURL" not in caplog.text
    assert tls_server.requests == []
    fake.assert_clean()
