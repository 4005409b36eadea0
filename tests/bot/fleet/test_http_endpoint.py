"""The health and metrics endpoint on a real loopback socket: what each path answers, readiness as it
moves, the Prometheus text as prometheus-client's own parser reads it, and the strict request parser
refusing what a probe or a scraper would never send."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.fleet import http
from bot.fleet.http import MAX_HEAD_BYTES, EndpointError, HealthEndpoint, serving
from bot.fleet.metrics import NAMES, RUN_STATES, Metrics, Reading
from bot.fleet.readiness import Readiness
from tests.support.runs import free_port

READING = Reading(ready=True, voice_calls=2, shards_held=1, turns_committed=7, late_ticks=3, frames_shed=5,
                  provider_reconnects=1, provider_rollovers=4, runs={"running": 2, "completed": 9},
                  listener_lag_s=1.5)


@contextlib.asynccontextmanager
async def endpoint(readiness: Readiness | None = None, reading: Reading = READING, **options):
    async def read() -> Reading:
        return reading

    ep = HealthEndpoint(readiness or Readiness("starting: test"), Metrics(read), **options)
    async with serving(("127.0.0.1", free_port()), ep) as server:
        host, port = server.sockets[0].getsockname()[:2]
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as client:
            yield ep, client, (host, port)


async def raw(address: tuple[str, int], request: bytes) -> bytes:
    """Send `request` as is; everything the server answers before it closes."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(request)
        await writer.drain()
        return await reader.read()
    finally:
        writer.close()


async def test_healthz_answers_200_and_readyz_follows_starting_ready_draining():
    readiness = Readiness("starting: not connected to Discord yet")
    async with endpoint(readiness) as (_, client, _):
        assert (await client.get("/healthz")).status_code == 200
        starting = await client.get("/readyz")
        assert (starting.status_code, starting.text) == (503, "starting: not connected to Discord yet\n")
        readiness.ready()
        ready = await client.get("/readyz")
        assert (ready.status_code, ready.text) == (200, "ready\n")
        await readiness.drain("draining: shutting down")
        readiness.ready()  # only forward: a draining process never becomes ready again
        draining = await client.get("/readyz")
        assert (draining.status_code, draining.text) == (503, "draining: shutting down\n")
        assert (await client.get("/healthz")).status_code == 200  # still alive while draining


async def test_metrics_parse_with_prometheus_client_and_show_the_reading():
    async with endpoint() as (_, client, _):
        answer = await client.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(answer.text)}
    # the parser drops a counter's _total from the family name; the samples keep it
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert {name.removesuffix("_total") for name in NAMES} <= set(families)
    assert all(name.startswith("switchboard_") for name in families)  # our registry only, no process_/python_
    assert samples[("switchboard_voice_calls", ())] == 2 and samples[("switchboard_shards_held", ())] == 1
    assert samples[("switchboard_ready", ())] == 1
    assert samples[("switchboard_turns_committed_total", ())] == 7
    assert samples[("switchboard_room_late_ticks_total", ())] == 3
    assert samples[("switchboard_room_frames_shed_total", ())] == 5
    assert samples[("switchboard_provider_reconnects_total", ())] == 1
    assert samples[("switchboard_provider_rollovers_total", ())] == 4
    assert samples[("switchboard_lease_renewals_failed_total", ())] == 0
    assert samples[("switchboard_listener_lag_seconds", ())] == 1.5
    runs = {dict(labels)["state"]: value for (name, labels), value in samples.items() if name == "switchboard_runs"}
    assert runs == {state: {"running": 2, "completed": 9}.get(state, 0) for state in RUN_STATES}
    assert families["switchboard_voice_calls"].type == "gauge"
    assert families["switchboard_turns_committed"].type == "counter"


async def test_an_unreadable_store_leaves_the_runs_family_empty_not_zero():
    async with endpoint(reading=Reading(runs=None)) as (_, client, _):
        answer = await client.get("/metrics")
    families = {f.name: f for f in text_string_to_metric_families(answer.text)}
    assert families["switchboard_runs"].samples == [] and families["switchboard_listener_lag_seconds"].samples == []
    assert families["switchboard_voice_calls"].samples[0].value == 0


async def test_unknown_paths_are_404_and_a_query_string_is_ignored():
    async with endpoint() as (_, client, address):
        assert (await client.get("/")).status_code == 404
        dotted = await raw(address, b"GET /metrics/../healthz HTTP/1.1\r\n\r\n")  # as sent: httpx would tidy it
        assert dotted.startswith(b"HTTP/1.1 404 Not Found\r\n")
        assert (await client.get("/healthz/")).status_code == 404
        assert (await client.get("/healthz?verbose=1")).status_code == 200


async def test_head_answers_without_a_body_and_other_methods_are_405():
    async with endpoint() as (_, client, address):
        assert (await client.post("/healthz")).status_code == 405
        assert (await client.delete("/readyz")).status_code == 405
        head = await raw(address, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"Content-Length: 3\r\n"
                                                                      b"Cache-Control: no-store\r\n"
                                                                      b"Connection: close\r\n\r\n")


@pytest.mark.parametrize("request_bytes", [
    b"GET /healthz\r\n\r\n",  # no version
    b"GET /healthz HTTP/2.0\r\n\r\n",
    b"GET  /healthz HTTP/1.1\r\n\r\n",
    b"GET healthz HTTP/1.1\r\n\r\n",  # not an origin-form path
    b"GET /heal\x00thz HTTP/1.1\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\n\n",  # a TLS hello on the plain port
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n",  # cut short: no blank line before the close
    b"GET /healthz HTTP/1.1\r\n" + b"X: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n",  # one line past the limit
    b"GET /healthz HTTP/1.1\r\n" + b"X: a\r\n" * 100 + b"\r\n",  # too many header lines
])
async def test_a_malformed_request_is_400_and_closed(request_bytes):
    async with endpoint() as (_, _, address):
        answer = await raw(address, request_bytes) if request_bytes.endswith(b"\n\n") else await _cut(address,
                                                                                                      request_bytes)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Connection: close" in answer


async def _cut(address: tuple[str, int], request: bytes) -> bytes:
    """Send `request`, then end the sending side, as a client that gives up mid-head."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(request)
        writer.write_eof()
        return await reader.read()
    finally:
        writer.close()


async def test_a_client_that_sends_no_head_in_time_gets_408():
    async with endpoint(head_timeout_s=0) as (_, _, address):
        reader, writer = await asyncio.open_connection(*address)
        try:
            answer = await reader.read()  # nothing sent: the server gives up on its own
        finally:
            writer.close()
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")


async def test_past_the_connection_limit_a_client_is_told_busy(monkeypatch):
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 1)
    async with endpoint() as (_, _, address):
        reader, first = await asyncio.open_connection(*address)  # accepted first: its handler holds the one place
        try:
            first.write(b"GET /healthz HTTP/1.1\r\n")  # and waits for the rest of its head
            await first.drain()
            busy = await raw(address, b"GET /healthz HTTP/1.1\r\n\r\n")
            first.write_eof()  # gives up mid-head: 400, and the server closes it (after freeing its place)
            assert (await reader.read()).startswith(b"HTTP/1.1 400 Bad Request\r\n")
        finally:
            first.close()
        assert busy.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and busy.endswith(b"busy\n")
        assert (await raw(address, b"GET /healthz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")  # freed


async def test_a_port_in_use_is_one_line_naming_the_setting():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = taken.getsockname()
        with pytest.raises(EndpointError) as refused:
            async with serving(address, HealthEndpoint(Readiness(), Metrics(lambda: None))):  # type: ignore[arg-type]
                pass
    text = str(refused.value)
    assert "\n" not in text and "SWITCHBOARD_HTTP_ADDR" in text and "in use" in text
    assert f"127.0.0.1:{address[1]}" in text


async def test_a_host_that_does_not_resolve_is_one_line():
    with pytest.raises(EndpointError, match="no such host"):
        async with serving(("no-such-host.invalid", 9464), HealthEndpoint(Readiness(), Metrics(lambda: None))):  # type: ignore[arg-type]
            pass


async def test_unset_address_serves_nothing():
    async with serving(None, HealthEndpoint(Readiness(), Metrics(lambda: None))) as server:  # type: ignore[arg-type]
        assert server is None


async def test_a_failing_reading_is_500_and_the_endpoint_keeps_serving(caplog):
    async def broken() -> Reading:
        raise RuntimeError("boom")

    ep = HealthEndpoint(Readiness(), Metrics(broken))
    async with serving(("127.0.0.1", free_port()), ep) as server:
        host, port = server.sockets[0].getsockname()[:2]
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as client:
            assert (await client.get("/metrics")).status_code == 500
            assert (await client.get("/healthz")).status_code == 200
    assert "answering /metrics failed" in caplog.text
