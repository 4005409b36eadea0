"""The Smartnumbers stream client against a loopback fake server (tests/support/fake_smartnumbers.py).

No test sleeps: the backoff sleep, the jitter and the clock are injected; the handler is steered with
events; the receive loop is observed through a spy around the socket's `recv`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import quote

import pytest

from listener.stream import (
    KEY_VARIABLE,
    NoRedirectConnect,
    StreamClient,
    StreamConfigError,
    check_key,
    check_stream_url,
)
from tests.support.clock import VirtualClock
from tests.support.fake_smartnumbers import FakeSmartnumbers, direct_transcript_event, transcript_url_event

KEY = "sk-stream-SECRET-7f3a9c"
LOOPBACK = frozenset({"127.0.0.1"})
PROD = "connections.smartnumbers.labs.bandwidth.com"


# -- helpers ---------------------------------------------------------------------------------------------


class Sleeper:
    """The injected backoff sleep: records each delay, runs `hook(n, delay)`, returns at once — or,
    from call `block_from` on, waits until cancelled (as a real long sleep would)."""

    def __init__(self, block_from: int | None = None, hook: Any = None) -> None:
        self.delays: list[float] = []
        self.block_from, self.hook = block_from, hook
        self._changed = asyncio.Event()

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        if self.hook is not None:
            self.hook(len(self.delays), delay)
        self._changed.set()
        self._changed = asyncio.Event()
        if self.block_from is not None and len(self.delays) >= self.block_from:
            await asyncio.Event().wait()

    async def wait_count(self, n: int) -> None:
        async with asyncio.timeout(5):
            while len(self.delays) < n:
                await self._changed.wait()


class Handler:
    """The injected `handle`: records calls; events listed in `gated` wait for `release(event_id)`."""

    def __init__(self, gated: tuple[str, ...] = (), fail: Exception | None = None) -> None:
        self.calls: list[dict] = []
        self.gates = {eid: asyncio.Event() for eid in gated}
        self.started: dict[str, asyncio.Event] = {}
        self.finished: set[str] = set()
        self.cancelled: list[str] = []
        self.running = self.max_running = 0
        self.fail = fail

    def _started(self, eid: str) -> asyncio.Event:
        return self.started.setdefault(eid, asyncio.Event())

    async def __call__(self, event: dict) -> dict:
        eid = event.get("event_id") or event["conversation_id"]
        self.calls.append(event)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self._started(eid).set()
        try:
            if eid in self.gates:
                await self.gates[eid].wait()
            if self.fail is not None:
                raise self.fail
            self.finished.add(eid)
            return body_for(event)
        except asyncio.CancelledError:
            self.cancelled.append(eid)
            raise
        finally:
            self.running -= 1

    def has_started(self, eid: str) -> bool:
        return eid in self.started and self.started[eid].is_set()

    async def wait_started(self, eid: str) -> None:
        await asyncio.wait_for(self._started(eid).wait(), 5)

    def release(self, eid: str) -> None:
        self.gates[eid].set()

    def calls_for(self, eid: str) -> int:
        return sum(1 for c in self.calls if c.get("event_id") == eid)


def body_for(event: dict) -> dict:
    return {
        "event_id": event.get("event_id"),
        "conversation_id": event["conversation_id"],
        "success": True,
        "stages": {"download": "ok", "parse": "ok", "archive": "ok", "review": "queued", "memory": "ok"},
        "errors": [],
        "job_id": "job_review_1",
        "job_ids": ["job_review_1", "job_cb_2"],
    }


class RecvSpy:
    """Wraps the real connect so a test can see the receive loop come back for the next message."""

    def __init__(self) -> None:
        self.recv_calls = 0
        self.kwargs: list[dict] = []
        self._changed = asyncio.Event()

    async def connect(self, url: str, **kwargs: Any) -> Any:
        self.kwargs.append(kwargs)
        return _SpiedSocket(await NoRedirectConnect(url, **kwargs), self)

    def _called(self) -> None:
        self.recv_calls += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_recv(self, n: int) -> None:
        async with asyncio.timeout(5):
            while self.recv_calls < n:
                await self._changed.wait()


class _SpiedSocket:
    def __init__(self, ws: Any, spy: RecvSpy) -> None:
        self._ws, self._spy = ws, spy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ws, name)

    async def recv(self) -> Any:
        self._spy._called()
        return await self._ws.recv()


@pytest.fixture
async def fake():
    async with FakeSmartnumbers(key=KEY) as server:
        yield server


@pytest.fixture
async def make_client():
    clients: list[StreamClient] = []

    def make(fake: FakeSmartnumbers, **overrides: Any) -> StreamClient:
        options: dict[str, Any] = dict(
            key=lambda: KEY, allowed_hosts=LOOPBACK, allow_insecure_local=True, handle=Handler(),
            client_name="switchboard-test", jitter=lambda d: d, sleep=Sleeper(), clock=VirtualClock(1000.0),
        )
        options.update(overrides)
        client = StreamClient(fake.url, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.stop()


# -- connecting ------------------------------------------------------------------------------------------


async def test_hello_on_connect_with_the_key_only_in_the_upgrade_header(fake, make_client):
    spy = RecvSpy()
    client = make_client(fake, connect=spy.connect, max_message_bytes=4096)
    await client.start()
    await fake.wait_connection(1)
    assert fake.hellos[1] == {"type": "hello", "protocol_version": 1, "client": "switchboard-test"}
    assert fake.auth_headers == [f"Bearer {KEY}"]
    options = spy.kwargs[0]
    assert options["max_size"] == 4096 and options["proxy"] is None and options["ping_interval"] == 20
    assert client.stats.connects == 1 and client.stats.connected
    fake.assert_clean()


async def test_missing_or_blank_key_refuses_to_start(fake, make_client):
    for value in (None, "", "   "):
        client = make_client(fake, key=lambda v=value: v)
        with pytest.raises(StreamConfigError, match=KEY_VARIABLE + " is not set"):
            await client.start()
        assert not client.running
    for bad in ("bad\x00" + KEY, KEY + "\u00e9"):
        with pytest.raises(StreamConfigError, match="characters") as info:
            check_key(bad)
        assert KEY not in str(info.value)
    assert check_key(f"  {KEY}\n") == KEY
    assert fake.attempts == 0


# -- events and acks -------------------------------------------------------------------------------------


async def test_an_event_gets_exactly_one_ack_with_the_handlers_body(fake, make_client):
    handler = Handler()
    client = make_client(fake, handle=handler)
    await client.start()
    await fake.wait_connection(1)
    event = transcript_url_event("evt_1")
    await fake.send_event(event)
    ack = await fake.ack_for("evt_1")
    assert ack == {"type": "transcript_ack", "protocol_version": 1, **body_for(event)}
    assert handler.calls == [event]
    await client.stop()
    await fake.wait_closed(1)  # everything the client sent before closing has arrived
    assert len(fake.acks_for("evt_1")) == 1
    assert client.stats.acks_sent == 1
    fake.assert_clean()


async def test_a_direct_transcript_is_handled_and_acked(fake, make_client):
    client = make_client(fake)
    await client.start()
    await fake.wait_connection(1)
    await fake.send_event(direct_transcript_event("conv_001"))
    ack = await fake.wait_for(lambda: next((a for _, a in fake.acks if a["conversation_id"] == "conv_001"), None))
    assert ack["event_id"] is None and ack["success"] is True
    fake.assert_clean()


async def test_a_failing_handler_still_gets_an_ack_saying_so(fake, make_client):
    client = make_client(fake, handle=Handler(fail=KeyError("secret detail")))
    await client.start()
    await fake.wait_connection(1)
    await fake.send_event(transcript_url_event("evt_bad", "call_bad"))
    ack = await fake.ack_for("evt_bad")
    assert ack["success"] is False and ack["conversation_id"] == "call_bad"
    assert ack["errors"] == [{"stage": "internal", "message": "KeyError"}]
    assert ack["job_id"] is None and ack["job_ids"] == []
    assert client.stats.handler_errors == 1
    fake.assert_clean()


async def test_two_slow_events_are_handled_concurrently(fake, make_client):
    handler = Handler(gated=("evt_1", "evt_2"))
    client = make_client(fake, handle=handler)
    await client.start()
    await fake.wait_connection(1)
    await fake.send_event(transcript_url_event("evt_1"))
    await fake.send_event(transcript_url_event("evt_2"))
    await handler.wait_started("evt_1")
    await handler.wait_started("evt_2")  # the first is still blocked: the loop did not wait for it
    handler.release("evt_2")
    await fake.ack_for("evt_2")
    assert fake.acks_for("evt_1") == [] and "evt_1" not in handler.finished
    handler.release("evt_1")
    await fake.ack_for("evt_1")
    fake.assert_clean()


async def test_concurrency_is_bounded_but_the_receive_loop_keeps_reading(fake, make_client):
    spy = RecvSpy()
    handler = Handler(gated=("evt_1", "evt_2", "evt_3"))
    client = make_client(fake, handle=handler, concurrency=2, connect=spy.connect)
    await client.start()
    await fake.wait_connection(1)
    for n in (1, 2, 3):
        await fake.send_event(transcript_url_event(f"evt_{n}"))
    await spy.wait_recv(4)  # all three dispatched; the loop is waiting for a fourth message
    await handler.wait_started("evt_1")
    await handler.wait_started("evt_2")
    assert not handler.has_started("evt_3")
    assert client.stats.in_flight == 3
    handler.release("evt_1")
    await handler.wait_started("evt_3")
    handler.release("evt_2")
    handler.release("evt_3")
    for n in (1, 2, 3):
        await fake.ack_for(f"evt_{n}")
    assert handler.max_running == 2
    fake.assert_clean()


async def test_lag_is_the_wait_of_the_oldest_event_still_being_handled_by_the_injected_clock(fake, make_client):
    clock = VirtualClock(1000.0)
    handler = Handler(gated=("evt_1", "evt_2"))
    client = make_client(fake, handle=handler, clock=clock)
    await client.start()
    await fake.wait_connection(1)
    assert client.stats.lag_s == 0.0  # nothing taken
    await fake.send_event(transcript_url_event("evt_1"))
    await handler.wait_started("evt_1")
    clock.now += 4.0
    await fake.send_event(transcript_url_event("evt_2"))
    await handler.wait_started("evt_2")
    clock.now += 1.5
    assert client.stats.lag_s == 5.5  # evt_1's wait, not evt_2's
    handler.release("evt_1")
    await fake.ack_for("evt_1")  # acked: its handler is done
    assert client.stats.lag_s == 1.5  # now the oldest is evt_2
    handler.release("evt_2")
    await fake.ack_for("evt_2")
    assert client.stats.lag_s == 0.0
    fake.assert_clean()


async def test_malformed_json_unknown_types_and_non_objects_get_no_ack_and_do_not_stop_the_stream(
    fake, make_client, caplog
):
    client = make_client(fake)
    await client.start()
    await fake.wait_connection(1)
    await fake.send_raw('{"type": "transcript_url", "event_id": "evt_broken"')
    await fake.send_event({"type": "mystery", "event_id": "evt_mystery", "conversation_id": "c"})
    await fake.send_event({"event_id": "evt_no_type", "conversation_id": "c"})
    await fake.send_raw("[1, 2, 3]")
    await fake.send_raw('"just a string"')
    await fake.send_event(transcript_url_event("evt_ok"))
    await fake.ack_for("evt_ok")
    await client.stop()
    await fake.wait_closed(1)
    assert [a["event_id"] for _, a in fake.acks] == ["evt_ok"]
    assert fake.connections == 1
    stats = client.stats
    assert (stats.malformed, stats.ignored, stats.acks_sent) == (1, 4, 1)
    assert "not valid JSON" in caplog.text
    fake.assert_clean()


# -- losing the connection -------------------------------------------------------------------------------


async def test_an_oversized_frame_closes_with_1009_then_reconnects_and_continues(fake, make_client):
    sleeper = Sleeper()
    client = make_client(fake, max_message_bytes=1024, sleep=sleeper)
    await client.start()
    await fake.wait_connection(1)
    await fake.send_oversized(4096)
    code, _ = await fake.wait_closed(1)
    assert code == 1009
    await fake.wait_connection(2)
    await fake.send_event(transcript_url_event("evt_after"))
    await fake.ack_for("evt_after", conn=2)
    assert sleeper.delays == [1.0]
    stats = client.stats
    assert (stats.oversized, stats.reconnects, stats.connects) == (1, 1, 2)
    fake.assert_clean()


async def test_server_closing_mid_event_loses_that_ack_and_the_redelivery_is_acked(fake, make_client, caplog):
    handler = Handler(gated=("evt_1",))
    client = make_client(fake, handle=handler)
    await client.start()
    await fake.wait_connection(1)
    await fake.send_event(transcript_url_event("evt_1"))
    await handler.wait_started("evt_1")
    await fake.drop(1)
    await fake.wait_connection(2)
    handler.release("evt_1")
    await client.drain()
    assert client.stats.acks_lost == 1 and fake.acks == []
    assert "redelivers it" in caplog.text
    await fake.send_event(transcript_url_event("evt_1"))  # the server's redelivery
    await fake.ack_for("evt_1", conn=2)
    assert handler.calls_for("evt_1") == 2  # handled again: `handle` must be idempotent
    fake.assert_clean()


async def test_a_redelivery_while_still_handling_is_not_handled_twice(fake, make_client):
    handler, spy = Handler(gated=("evt_1",)), RecvSpy()
    client = make_client(fake, handle=handler, connect=spy.connect)
    await client.start()
    await fake.wait_connection(1)
    await fake.send_event(transcript_url_event("evt_1"))
    await handler.wait_started("evt_1")
    await fake.drop(1, abort=True)
    await fake.wait_connection(2)
    await fake.send_event(transcript_url_event("evt_1"))
    await spy.wait_recv(4)  # 1: evt_1, 2: the close, 3: the redelivery, 4: waiting for more
    handler.release("evt_1")
    await fake.ack_for("evt_1", conn=2)
    await client.drain()
    assert handler.calls_for("evt_1") == 1
    assert client.stats.acks_lost == 1 and len(fake.acks) == 1
    fake.assert_clean()


# -- keys and backoff ------------------------------------------------------------------------------------


async def test_a_key_rotated_between_reconnects_is_used_on_the_next_connection(fake, make_client):
    current = {"key": KEY}
    client = make_client(fake, key=lambda: current["key"])
    await client.start()
    await fake.wait_connection(1)
    fake.set_key("sk-stream-ROTATED-2")
    current["key"] = "sk-stream-ROTATED-2"
    await fake.drop(1)
    await fake.wait_connection(2)
    assert fake.auth_headers == [f"Bearer {KEY}", "Bearer sk-stream-ROTATED-2"]
    await fake.send_event(transcript_url_event("evt_2"))
    await fake.ack_for("evt_2", conn=2)
    fake.assert_clean()


async def test_a_server_side_rotation_is_picked_up_once_the_key_source_has_it(fake, make_client):
    current = {"key": KEY}

    def rotate_locally(n: int, _delay: float) -> None:
        if n == 3:  # the service's key file is updated a little after the server rotated
            current["key"] = "sk-stream-NEW"

    sleeper = Sleeper(hook=rotate_locally)
    client = make_client(fake, key=lambda: current["key"], sleep=sleeper)
    await client.start()
    await fake.wait_connection(1)
    fake.set_key("sk-stream-NEW")
    await fake.drop(1)
    await fake.wait_connection(2)
    assert fake.rejected == 2 and sleeper.delays == [1.0, 2.0, 4.0]
    assert fake.auth_headers[-1] == "Bearer sk-stream-NEW"
    assert client.stats.auth_failures == 2
    fake.assert_clean()


async def test_a_wrong_key_backs_off_1_2_4_to_60_and_never_reaches_the_logs(fake, make_client, caplog):
    caplog.set_level(logging.DEBUG)
    fake.set_key("the-right-key")
    sleeper = Sleeper(block_from=9)
    client = make_client(fake, sleep=sleeper)
    await client.start()
    await sleeper.wait_count(9)
    assert sleeper.delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert fake.rejected == 9 and fake.connections == 0
    stats = client.stats
    assert stats.auth_failures == 9 and stats.connects == 0 and "HTTP 401" in stats.last_error
    assert "HTTP 401" in caplog.text and KEY_VARIABLE in caplog.text
    assert KEY not in caplog.text and "Bearer" not in caplog.text
    assert KEY not in repr(stats.as_dict())
    await client.stop()


async def test_the_jitter_shapes_every_delay(fake, make_client):
    fake.set_key("the-right-key")
    sleeper = Sleeper(block_from=3)
    client = make_client(fake, sleep=sleeper, jitter=lambda d: d / 4)
    await client.start()
    await sleeper.wait_count(3)
    assert sleeper.delays == [0.25, 0.5, 1.0]


async def test_a_good_connection_resets_the_backoff_and_a_short_silent_one_does_not(fake, make_client):
    clock = VirtualClock(1000.0)
    current = {"key": "wrong"}

    def fix_key(n: int, _delay: float) -> None:
        if n == 3:
            current["key"] = KEY

    sleeper = Sleeper(hook=fix_key)
    client = make_client(fake, key=lambda: current["key"], sleep=sleeper, clock=clock)
    await client.start()
    await fake.wait_connection(1)
    assert sleeper.delays == [1.0, 2.0, 4.0]
    await fake.send_event(transcript_url_event("evt_1"))  # a message: connection 1 was good
    await fake.ack_for("evt_1")
    await fake.drop(1)
    await fake.wait_connection(2)
    assert sleeper.delays[3:] == [1.0]
    await fake.drop(2)  # silent and short: not good
    await fake.wait_connection(3)
    assert sleeper.delays[4:] == [2.0]
    clock.now += 10.0  # open for 10 s: good
    await fake.drop(3)
    await fake.wait_connection(4)
    assert sleeper.delays[5:] == [1.0]
    fake.assert_clean()


async def test_a_key_gone_at_reconnect_is_logged_and_retried_not_fatal(fake, make_client, caplog):
    current: dict[str, str | None] = {"key": KEY}

    def restore(n: int, _delay: float) -> None:
        if n == 2:
            current["key"] = KEY

    sleeper = Sleeper(hook=restore)
    client = make_client(fake, key=lambda: current["key"], sleep=sleeper)
    await client.start()
    await fake.wait_connection(1)
    current["key"] = None
    await fake.drop(1)
    await fake.wait_connection(2)
    assert sleeper.delays == [1.0, 2.0] and fake.attempts == 2
    assert f"{KEY_VARIABLE} is not set" in caplog.text
    assert client.running
    fake.assert_clean()


async def test_a_redirect_is_not_followed(make_client):
    async with FakeSmartnumbers(key=KEY) as elsewhere:
        async with FakeSmartnumbers(key=KEY, redirect_to=elsewhere.url) as fake:
            sleeper = Sleeper(block_from=1)
            client = make_client(fake, sleep=sleeper)
            await client.start()
            await sleeper.wait_count(1)
            assert fake.attempts == 1 and elsewhere.attempts == 0
            assert "redirect" in client.stats.last_error
            await client.stop()


# -- URL vetting -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "hosts", "dev", "why"),
    [
        ("ws://example.com/ws/hermes", {"example.com"}, True, "only to a loopback host"),
        ("ws://10.0.0.5:8080/ws", {"10.0.0.5"}, True, "only to a loopback host"),
        ("ws://169.254.169.254/ws", {"169.254.169.254"}, True, "only to a loopback host"),
        ("ws://127.1/ws", {"127.1"}, True, "only to a loopback host"),
        ("ws://localhost.example.com/ws", {"localhost.example.com"}, True, "only to a loopback host"),
        ("ws://127.0.0.1:9000/ws/hermes", {"127.0.0.1"}, False, "only wss://"),
        ("ws://localhost:9000/ws/hermes", {"localhost"}, False, "only wss://"),
        ("wss://evil.example.com/ws/hermes", {PROD}, False, "not in SMARTNUMBERS_ALLOWED_STREAM_HOSTS"),
        (f"wss://{PROD}.evil.example.com/ws", {PROD}, False, "not in SMARTNUMBERS_ALLOWED_STREAM_HOSTS"),
        ("ws://127.0.0.1:9000/ws", {PROD}, True, "not in SMARTNUMBERS_ALLOWED_STREAM_HOSTS"),
        (f"wss://{PROD}/ws/hermes", set(), False, "no approved stream hosts"),
        (f"wss://user:{KEY}@{PROD}/ws/hermes", {PROD}, False, "credentials"),
        (f"wss://{PROD}@evil.example.com/ws", {PROD, "evil.example.com"}, False, "credentials"),
        (f"https://{PROD}/ws/hermes", {PROD}, False, "only wss://"),
        (f"wss://{PROD}/ws#frag", {PROD}, False, "fragment"),
        (f"wss://{PROD}/ws hermes", {PROD}, False, "whitespace"),
    ],
)
def test_stream_urls_are_refused(url, hosts, dev, why):
    with pytest.raises(StreamConfigError, match=why) as info:
        check_stream_url(url, allowed_hosts=frozenset(hosts), allow_insecure_local=dev)
    message = str(info.value)
    assert "\n" not in message and KEY not in message and message.startswith("stream URL refused")
    with pytest.raises(StreamConfigError):  # the constructor refuses too
        StreamClient(url, key=lambda: KEY, allowed_hosts=frozenset(hosts), allow_insecure_local=dev,
                     handle=Handler())


@pytest.mark.parametrize(
    ("url", "hosts", "dev"),
    [
        (f"wss://{PROD}/ws/hermes", {PROD}, False),
        ("wss://Connections.SmartNumbers.labs.bandwidth.com/ws/hermes", {PROD.upper()}, False),
        (f"wss://{PROD}./ws/hermes", {PROD}, False),
        ("ws://127.0.0.1:9000/ws/hermes", {"127.0.0.1"}, True),
        ("ws://127.9.8.7:9000/ws", {"127.9.8.7"}, True),
        ("ws://[::1]:9000/ws", {"::1"}, True),
        ("ws://LOCALHOST:9000/ws", {"localhost"}, True),
        ("wss://127.0.0.1:9443/ws", {"127.0.0.1"}, False),
    ],
)
def test_stream_urls_that_are_accepted(url, hosts, dev):
    target = check_stream_url(url, allowed_hosts=frozenset(hosts), allow_insecure_local=dev)
    assert target.host in {h.lower() for h in hosts} and "?" not in target.display


# -- stopping --------------------------------------------------------------------------------------------


async def test_stop_is_prompt_cancels_handlers_and_closes_with_1000(fake, make_client):
    handler = Handler(gated=("evt_1",))
    client = make_client(fake, handle=handler)
    await client.start()
    await fake.wait_connection(1)
    await fake.send_event(transcript_url_event("evt_1"))
    await handler.wait_started("evt_1")
    loop = asyncio.get_running_loop()
    began = loop.time()
    await client.stop()
    assert loop.time() - began < 1.0
    assert (await fake.wait_closed(1))[0] == 1000
    assert handler.cancelled == ["evt_1"] and fake.acks == []
    assert not client.running and not client.stats.connected
    fake.assert_clean()


async def test_stop_during_a_backoff_wait_is_prompt(fake, make_client):
    fake.set_key("the-right-key")
    sleeper = Sleeper(block_from=1)
    client = make_client(fake, sleep=sleeper)
    await client.start()
    await sleeper.wait_count(1)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await client.stop()
    assert loop.time() - began < 1.0 and not client.running


# -- nothing secret or forged reaches a log line -------------------------------------------------------


class EchoingUpgradeServer:
    """A loopback server answering the WebSocket upgrade with a broken `101` whose `header` echoes
    the request's `Authorization` value (as `encode` renders it): a connection error whose own text
    carries the key, the way a misbehaving proxy or server can make one."""

    def __init__(self, header: str = "Sec-WebSocket-Accept", encode: Any = lambda value: value) -> None:
        self.header, self.encode = header, encode
        self.seen: list[str] = []
        self.url = ""
        self._server: Any = None

    async def __aenter__(self) -> EchoingUpgradeServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"ws://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/ws/hermes"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            auth = next(line.split(":", 1)[1].strip() for line in head.split("\r\n")
                        if line.lower().startswith("authorization:"))
            self.seen.append(auth)
            writer.write(f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         f"{self.header}: {self.encode(auth)}\r\n\r\n".encode("latin-1"))
            await writer.drain()
        finally:
            writer.close()


@pytest.mark.parametrize(("key", "header", "encode"), [
    (KEY, "Sec-WebSocket-Accept", lambda v: v),
    (KEY, "Upgrade", lambda v: v),
    ("sk-stream  SECRET-7f3a9c", "Sec-WebSocket-Accept", lambda v: v),  # a run of spaces inside the key
    ("sk-stream/SECRET-7f3a9c+=", "Sec-WebSocket-Accept", lambda v: quote(v, safe="")),  # as in a URL
], ids=["accept", "upgrade", "spaces", "percent-encoded"])
async def test_the_key_in_a_failing_connection_never_reaches_the_log_or_the_error(key, header, encode, make_client,
                                                                                caplog):
    caplog.set_level(logging.DEBUG)
    async with EchoingUpgradeServer(header, encode) as server:
        sleeper = Sleeper(block_from=1)
        client = StreamClient(server.url, key=lambda: key, allowed_hosts=LOOPBACK, allow_insecure_local=True,
                              handle=Handler(), jitter=lambda d: d, sleep=sleeper)
        try:
            await client.start()
            await sleeper.wait_count(1)
        finally:
            await client.stop()
    assert server.seen == [f"Bearer {key}"]  # the key went out, and came back in the server's answer
    error = client.stats.last_error
    assert error is not None and header in error and "<redacted>" in error, error
    for text in (error, caplog.text, repr(client.stats.as_dict())):
        assert "SECRET-7f3a9c" not in text and "Bearer sk" not in text, text


async def test_hostile_ids_never_forge_a_log_line_or_attach_a_traceback(fake, make_client, caplog):
    caplog.set_level(logging.DEBUG)
    event_id = "evt_1\nstream: connected to wss://evil.example/\x1b[2J"
    call_id = "call_1\r\nFORGED stream: key accepted\u2028FORGED"
    client = make_client(fake, handle=Handler(fail=ValueError(f"no transcript for {call_id}")))
    await client.start()
    await fake.wait_connection(1)
    await fake.send_event({"type": "x\nFORGED unknown"})
    await fake.send_event(transcript_url_event(event_id, call_id))
    ack = await fake.ack_for(event_id)
    assert ack["success"] is False and ack["conversation_id"] == call_id  # the ack itself is JSON: exact
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert failed and all(r.exc_info is None for r in caplog.records)  # one line, no traceback attached
    assert '"evt_1\\nstream: connected to wss://evil.example/\\x1b[2J"' in failed[0].getMessage()
    for record in caplog.records:
        line = record.getMessage()
        assert not any(ch in line for ch in "\n\r\x1b\u2028"), line
    assert not any(line.lstrip().startswith(("FORGED", "stream: connected to wss://evil"))
                   for line in caplog.text.splitlines())
    fake.assert_clean()
