"""The hermes-api lane: a run on Hermes Agent's api_server (`/v1/runs`), followed over SSE."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from httpx_sse import SSEError, aconnect_sse

from common.tls import verified_tls
from common.urls import display_url
from runs.config import RunsConfig
from runs.core import ApprovalRequested, Finished, Observation, Progress, RunState, RunTicket
from runs.hermes_wire import (
    HERMES_LOST,
    HermesFeatures,
    NotHermes,
    decode_event,
    error_message,
    event_observations,
    is_terminal_event,
    is_terminal_status,
    parse_capabilities,
    pending_notes,
    status_observation,
)
from runs.lanes.base import AlreadyEnded, Emit, LaneError, LaneProbe, LaneSnapshot, SubmitUnknown

log = logging.getLogger(__name__)

NAME = "hermes-api"
ENABLE_HINT = ("enable it in the Hermes gateway with API_SERVER_ENABLED=true and API_SERVER_KEY=<key>, "
               "restart the gateway, and give Switchboard the same key (SWITCHBOARD_HERMES_API_KEY)")
SUBMIT_RETRY_DELAYS = (0.5, 2.0)  # only for a connection that was refused: the run was certainly not received
BUSY_DELAYS = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)  # 429 (at its run cap) or 503 (draining): then every 30 s
MAX_POLL_FAILURES = 6
SSE_READ_TIMEOUT_S = 100.0  # Hermes sends a keepalive comment every 30 s
# A stream that carries nothing but keepalives this long may be one whose events went to another
# subscriber (Hermes has one queue per run): the run's status is asked, and ends the watch if it ended.
QUIET_S = 60.0
UNCONFIRMED = ("Switchboard stopped before hermes-api confirmed this run, so it may or may not have started "
               "there; it was not sent again, so it cannot run twice. Check Hermes, and ask again if it is "
               "not there")
# Each followed run holds one event stream (one connection) for as long as it runs, so streams get a
# pool of their own: however many runs are going, submissions, status, steer and stop always have
# connections. A run that starts while STREAM_LIMIT streams are open is followed by its status.
STREAM_LIMIT = 100
REQUEST_LIMIT = 20


def _why(exc: Exception) -> str:
    return type(exc).__name__


def _http_client(connections: int) -> httpx.AsyncClient:
    # trust_env=False: the api_server is normally on loopback; a proxy variable must not divert it
    return httpx.AsyncClient(trust_env=False, verify=verified_tls(), timeout=httpx.Timeout(30.0, connect=5.0),
                             limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections))


class RunGone(LaneError):
    """Hermes answered 404 for the run: it ended (a stop), or a restart lost it."""


class HermesApiLane:
    """Hermes api_server client (tested against 0.19.0); every verb beyond submit/status is gated on its
    capability flag. Requests and streams have separate pools (`request_limit`, `stream_limit`): open
    streams never starve a request; a run that starts while every stream is taken is polled instead."""

    name = NAME

    def __init__(self, config: RunsConfig, *, client: httpx.AsyncClient | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, stream_limit: int = STREAM_LIMIT,
                 request_limit: int = REQUEST_LIMIT) -> None:
        if stream_limit < 1 or request_limit < 1:
            raise ValueError("stream_limit and request_limit must be at least 1")
        self._config = config
        self._base = config.hermes_url.rstrip("/")
        self._where = display_url(config.hermes_url)
        self._auth = {"Authorization": f"Bearer {config.hermes_key}"} if config.hermes_key else {}
        self._own_client = client is None
        self._client = client or _http_client(request_limit)
        self._streams = _http_client(stream_limit)
        self._stream_limit = stream_limit
        self._streams_open = 0
        self._sleep = sleep
        self._features: HermesFeatures | None = None
        self._slots = asyncio.Semaphore(config.hermes_max_runs)
        self._holding: set[int] = set()  # tickets holding a slot, until their follow ends
        self._poll_only: set[int] = set()  # adopted after a restart: their stream may be shared
        self._asked: dict[int, ApprovalRequested] = {}  # the question each run's stream last put

    # -- discovery ---------------------------------------------------------------------------------

    async def probe(self) -> LaneProbe:
        try:
            response = await self._client.get(self._url("/v1/capabilities"), headers=self._auth,
                                               timeout=self._config.probe_timeout_s)
        except httpx.ConnectError:
            return self._unavailable("hermes-api is not running",
                                     f"nothing answers at {self._where}; {ENABLE_HINT}")
        except httpx.TimeoutException:
            return self._unavailable("hermes-api did not answer",
                                     f"{self._where} did not answer within {self._config.probe_timeout_s:g} s")
        except httpx.HTTPError as exc:
            return self._unavailable("hermes-api could not be reached",
                                     f"{self._where} could not be reached ({_why(exc)}); {ENABLE_HINT}")
        if response.status_code in (401, 403):
            fix = ("set SWITCHBOARD_HERMES_API_KEY to the gateway's API_SERVER_KEY" if not self._auth else
                   "check that SWITCHBOARD_HERMES_API_KEY matches the gateway's API_SERVER_KEY")
            return self._unavailable("hermes-api is running but rejected my key",
                                     f"the api_server at {self._where} answered HTTP {response.status_code}; {fix}")
        if response.status_code != 200:
            return self._unavailable("hermes-api is not a usable Hermes api_server",
                                     f"{self._where} answered /v1/capabilities with HTTP {response.status_code}; "
                                     f"{ENABLE_HINT}")
        try:
            self._features = parse_capabilities(response.json())
        except (ValueError, NotHermes) as exc:
            return self._unavailable("hermes-api is not a usable Hermes api_server",
                                     f"the server at {self._where}: {exc}")
        return LaneProbe(NAME, True, can_steer=self._features.steer)

    def _unavailable(self, reason: str, detail: str) -> LaneProbe:
        return LaneProbe(NAME, False, reason, f"{reason}: {detail}")

    async def _ensure_features(self) -> HermesFeatures:
        if self._features is None:
            probe = await self.probe()
            if not probe.available or self._features is None:
                raise LaneError(probe.detail)
        return self._features

    def can_steer(self) -> bool:
        return bool(self._features and self._features.steer)

    # -- submission --------------------------------------------------------------------------------

    async def start(self, ticket: RunTicket, emit: Emit | None = None) -> str:
        """Take one of the `hermes_max_runs` slots (waiting, "queued at Hermes", while all are taken),
        then POST /v1/runs. Hermes ignores Idempotency-Key, so a submission is sent again only when it
        certainly was not received (the connection was refused); when its fate is unknown it raises
        `SubmitUnknown` and is never resubmitted. 429/503 mean Hermes is full or draining: retried with
        backoff, said as "queued at Hermes". The slot is given back when `follow` ends."""
        if ticket.id not in self._holding:
            if self._slots.locked() and emit is not None:
                await emit(Progress(f"queued at Hermes: all {self._config.hermes_max_runs} of its run slots "
                                    f"are taken; it starts when one frees"))
            await self._slots.acquire()
            self._holding.add(ticket.id)
        try:
            return await self._submit(ticket, emit)
        except BaseException:
            self._free_slot(ticket.id)
            raise

    def _free_slot(self, run_id: int) -> None:
        if run_id in self._holding:
            self._holding.discard(run_id)
            self._slots.release()

    async def _submit(self, ticket: RunTicket, emit: Emit | None) -> str:
        refused = busy = 0
        waited = 0.0
        while True:
            try:
                response = await self._client.post(self._url("/v1/runs"), json={"input": ticket.task},
                                                   headers=self._auth)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                if refused == len(SUBMIT_RETRY_DELAYS):
                    raise LaneError(f"hermes-api at {self._where} is not running ({_why(exc)})") from None
                log.warning("run %s: hermes-api refused the connection (%s); nothing was sent, trying again",
                            ticket.id, _why(exc))
                await self._sleep(SUBMIT_RETRY_DELAYS[refused])
                refused += 1
                continue
            except httpx.TransportError as exc:
                raise SubmitUnknown(f"hermes-api at {self._where} may have started it: the submission went out "
                                    f"but no answer came back ({_why(exc)}). It was not sent again, so it "
                                    f"cannot run twice; check Hermes, and ask again if it is not there") from None
            if response.status_code not in (429, 503):
                break
            if waited >= self._config.timeout_s:
                raise LaneError(f"hermes-api stayed busy for {waited:g} s ({error_message(_json(response), '')})")
            if busy == 0 and emit is not None:
                why = "draining for a restart" if response.status_code == 503 else "running all the runs it takes"
                await emit(Progress(f"queued at Hermes: it is {why}; trying again shortly"))
            delay = BUSY_DELAYS[min(busy, len(BUSY_DELAYS) - 1)]
            busy += 1
            waited += delay
            await self._sleep(delay)
        data = _json(response)
        if response.status_code == 202 and isinstance(data, dict) and isinstance(data.get("run_id"), str):
            return data["run_id"]
        raise LaneError(self._refusal("refused the run", response, data))

    def _refusal(self, what: str, response: httpx.Response, data: Any) -> str:
        code = response.status_code
        if code in (401, 403):
            return f"hermes-api at {self._where} rejected my key"
        if code in (429, 503):
            return f"hermes-api is busy ({error_message(data, f'HTTP {code}')})"
        return f"hermes-api {what} (HTTP {code}: {error_message(data, 'no reason given')})"

    # -- following ---------------------------------------------------------------------------------

    @property
    def streams_open(self) -> int:  # how many runs are followed over their event stream right now
        return self._streams_open

    async def follow(self, ticket: RunTicket, emit: Emit) -> None:
        """Read the run's event stream; when it drops, is unavailable, goes quiet past `QUIET_S`, every
        stream slot is taken, or the run was adopted after a restart (its stream may be shared with a
        dead subscriber, which would take its last events with it), poll the status until it ends."""
        try:
            features = await self._ensure_features()
            if (features.events and ticket.id not in self._poll_only and self._streams_open < self._stream_limit
                    and await self._stream(ticket, emit)):
                return
            await self._poll(ticket, emit)
        finally:
            self._free_slot(ticket.id)
            self._poll_only.discard(ticket.id)
            self._asked.pop(ticket.id, None)

    async def _poll(self, ticket: RunTicket, emit: Emit) -> None:
        failures = 0
        while True:
            try:
                snapshot = await self.snapshot(ticket)
                failures = 0
            except LaneError as exc:
                failures += 1
                if failures >= MAX_POLL_FAILURES:
                    await emit(Finished(RunState.LOST, error=f"lost contact with hermes-api: {exc}"))
                    return
                snapshot = None
            if snapshot is not None:
                if snapshot.observation is not None:
                    await emit(snapshot.observation)
                if snapshot.terminal:
                    return
            await self._sleep(self._config.poll_interval_s)

    async def _stream(self, ticket: RunTicket, emit: Emit) -> bool:
        """True when the run's end was seen (on the stream, or by asking once it went quiet); False when
        the stream dropped or could not open."""
        self._streams_open += 1
        heard = [0]

        async def counted(obs: Observation) -> None:
            heard[0] += 1
            if isinstance(obs, ApprovalRequested):
                self._asked[ticket.id] = obs
            await emit(obs)

        reader = asyncio.create_task(self._read_stream(ticket, counted))
        watcher = asyncio.create_task(self._quiet_watch(ticket, emit, heard))
        try:
            done, _ = await asyncio.wait({reader, watcher}, return_when=asyncio.FIRST_COMPLETED)
            return (reader if reader in done else watcher).result()
        finally:
            for task in (reader, watcher):
                task.cancel()
            await asyncio.gather(reader, watcher, return_exceptions=True)
            self._streams_open -= 1

    async def _quiet_watch(self, ticket: RunTicket, emit: Emit, heard: list[int]) -> bool:
        while True:
            before = heard[0]
            await self._sleep(QUIET_S)
            if heard[0] != before:
                continue
            try:
                snapshot = await self.snapshot(ticket)
            except LaneError:
                continue
            if snapshot is not None and snapshot.terminal and snapshot.observation is not None:
                log.info("run %s: its stream went quiet and its status says it ended", ticket.id)
                await emit(snapshot.observation)
                return True

    async def _read_stream(self, ticket: RunTicket, emit: Emit) -> bool:
        timeout = httpx.Timeout(30.0, connect=5.0, read=SSE_READ_TIMEOUT_S)
        try:
            async with aconnect_sse(self._streams, "GET", self._url(f"/v1/runs/{ticket.external_id}/events"),
                                    headers=dict(self._auth), timeout=timeout) as source:
                if source.response.status_code != 200:
                    log.info("run %s: event stream unavailable (HTTP %s); polling status", ticket.id,
                             source.response.status_code)
                    return False
                async for message in source.aiter_sse():
                    decoded = decode_event(message.event, message.data)
                    if decoded is None:
                        continue
                    name, payload = decoded
                    for observation in event_observations(name, payload):
                        await emit(observation)
                    if is_terminal_event(name):
                        return True
        except (httpx.TransportError, SSEError) as exc:
            log.info("run %s: event stream dropped (%s); reconciling with the run status", ticket.id, _why(exc))
            return False
        log.info("run %s: event stream ended before the run did; reconciling with the run status", ticket.id)
        return False

    async def snapshot(self, ticket: RunTicket) -> LaneSnapshot | None:
        try:
            response = await self._client.get(self._url(f"/v1/runs/{ticket.external_id}"), headers=self._auth,
                                              timeout=10.0)
        except httpx.HTTPError as exc:
            raise LaneError(f"hermes-api at {self._where} could not be asked about the run "
                            f"({_why(exc)})") from None
        data = _json(response)
        if response.status_code == 404:
            return LaneSnapshot(Finished(RunState.LOST, error=HERMES_LOST), terminal=True)
        if response.status_code != 200 or not isinstance(data, dict):
            raise LaneError(self._refusal("could not report the run", response, data))
        return LaneSnapshot(status_observation(data, self._asked.get(ticket.id)), pending_notes(data),
                            is_terminal_status(data))

    # -- control -----------------------------------------------------------------------------------

    async def steer(self, ticket: RunTicket, text: str) -> None:
        features = await self._ensure_features()
        if not features.steer:
            raise LaneError("this Hermes does not offer steering (its api_server lists no run_steer), so a "
                            "note cannot reach the run; I can stop it instead")
        await self._control(ticket, "steer", {"input": text}, "did not take the note")

    async def answer(self, ticket: RunTicket, request_id: str | None, choice: str) -> None:
        features = await self._ensure_features()
        if not features.approval:
            raise LaneError("this Hermes api_server does not accept approval answers over the API")
        body: dict[str, Any] = {"choice": choice}
        if request_id:
            body["request_id"] = request_id
        await self._control(ticket, "approval", body, "did not take the answer")

    async def stop(self, ticket: RunTicket) -> str:
        features = await self._ensure_features()
        if not features.stop:
            raise LaneError("this Hermes api_server does not offer run_stop; stop it from Hermes itself")
        try:
            data = await self._control(ticket, "stop", None, "did not stop the run")
        except RunGone:  # Hermes answers 404 once a run has ended (or was lost in a restart)
            snapshot = await self.snapshot(ticket)
            if snapshot is not None and snapshot.terminal and snapshot.observation is not None:
                raise AlreadyEnded(snapshot.observation) from None
            raise
        status = data.get("status") if isinstance(data, dict) else None
        return status if isinstance(status, str) else "stopping"

    async def _control(self, ticket: RunTicket, verb: str, body: dict | None, failed: str) -> Any:
        if not ticket.external_id:
            raise LaneError("hermes-api has not accepted this run yet")
        try:
            response = await self._client.post(self._url(f"/v1/runs/{ticket.external_id}/{verb}"),
                                               json=body if body is not None else {}, headers=self._auth,
                                               timeout=10.0)
        except httpx.HTTPError as exc:
            raise LaneError(f"hermes-api at {self._where} could not be reached ({_why(exc)})") from None
        data = _json(response)
        if response.status_code == 200:
            return data
        if response.status_code == 404:
            raise RunGone("hermes-api no longer knows this run")
        raise LaneError(self._refusal(failed, response, data))

    async def reconcile(self, ticket: RunTicket) -> list[Observation]:
        """After a restart: a submission never confirmed is not sent again (Hermes ignores idempotency
        keys, so that could start it twice): its fate is unknown. A confirmed run's status is asked, and it
        is followed by its status from then on. Unreachable → lost: its fate cannot be known from here."""
        if not ticket.external_id:
            return [Finished(RunState.LOST, error=UNCONFIRMED)]
        try:
            snapshot = await self.snapshot(ticket)
        except LaneError as exc:
            return [Finished(RunState.LOST, error=f"Switchboard restarted and could not ask hermes-api about it: "
                                                  f"{exc}")]
        self._poll_only.add(ticket.id)
        return [snapshot.observation] if snapshot is not None and snapshot.observation is not None else []

    async def aclose(self) -> None:
        await self._streams.aclose()
        if self._own_client:
            await self._client.aclose()

    def _url(self, path: str) -> str:
        return self._base + path


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
