"""The hermes-api lane: a run on Hermes Agent's api_server (`/v1/runs`), followed over SSE."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import httpx
from httpx_sse import SSEError, aconnect_sse

from common.tls import verified_tls
from common.urls import display_url
from runs.config import RunsConfig
from runs.core import Accepted, Finished, Observation, RunState, RunTicket
from runs.hermes_wire import (
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
from runs.lanes.base import Emit, LaneError, LaneProbe, LaneSnapshot

log = logging.getLogger(__name__)

NAME = "hermes-api"
ENABLE_HINT = ("enable it in the Hermes gateway with API_SERVER_ENABLED=true and API_SERVER_KEY=<key>, "
               "restart the gateway, and give Switchboard the same key (SWITCHBOARD_HERMES_API_KEY)")
SUBMIT_RETRY_DELAYS = (0.5, 2.0)
MAX_POLL_FAILURES = 6
SSE_READ_TIMEOUT_S = 100.0  # Hermes sends a keepalive comment every 30 s
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


class HermesApiLane:
    """Hermes api_server client. Every verb beyond submit/status is gated on its capability flag.

    Requests and event streams use separate connection pools (`request_limit`, `stream_limit`
    connections): open streams never starve a request. At most `stream_limit` runs are followed over
    their event stream at once; a run that starts while they are all taken is followed by its status.
    """

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

    async def start(self, ticket: RunTicket) -> str:
        """POST /v1/runs under the ticket's Idempotency-Key; a retry replays instead of starting twice."""
        headers = {**self._auth, "Idempotency-Key": ticket.idempotency_key}
        body = {"input": ticket.task}
        response: httpx.Response | None = None
        for attempt in range(len(SUBMIT_RETRY_DELAYS) + 1):
            try:
                response = await self._client.post(self._url("/v1/runs"), json=body, headers=headers)
                break
            except httpx.TransportError as exc:
                if attempt == len(SUBMIT_RETRY_DELAYS):
                    raise LaneError(f"hermes-api at {self._where} did not confirm the submission "
                                    f"({_why(exc)})") from None
                log.warning("run %s: submission to hermes-api failed (%s); retrying with the same key",
                            ticket.id, _why(exc))
                await self._sleep(SUBMIT_RETRY_DELAYS[attempt])
        assert response is not None
        data = _json(response)
        if response.status_code == 202 and isinstance(data, dict) and isinstance(data.get("run_id"), str):
            if data.get("replayed"):
                log.info("run %s: hermes-api replayed %s for our idempotency key", ticket.id, data["run_id"])
            return data["run_id"]
        raise LaneError(self._refusal("refused the run", response, data))

    def _refusal(self, what: str, response: httpx.Response, data: Any) -> str:
        code = response.status_code
        if code in (401, 403):
            return f"hermes-api at {self._where} rejected my key"
        if code == 409 and isinstance(data, dict) and (data.get("error") or {}).get("code") == "idempotency_key_conflict":
            return "hermes-api says this run's idempotency key was already used for a different task"
        if code in (429, 503):
            return f"hermes-api is busy ({error_message(data, f'HTTP {code}')})"
        return f"hermes-api {what} (HTTP {code}: {error_message(data, 'no reason given')})"

    # -- following ---------------------------------------------------------------------------------

    @property
    def streams_open(self) -> int:
        """How many runs are followed over their event stream right now."""
        return self._streams_open

    async def follow(self, ticket: RunTicket, emit: Emit) -> None:
        """Read the run's event stream; when it drops, is unavailable, or every stream slot is taken,
        poll the status until it ends (a stream opened later could replay questions already answered)."""
        features = await self._ensure_features()
        if features.events and self._streams_open < self._stream_limit and await self._stream(ticket, emit):
            return
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
        """True when the stream delivered the run's end; False when it dropped or could not open."""
        self._streams_open += 1
        try:
            return await self._read_stream(ticket, emit)
        finally:
            self._streams_open -= 1

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
            return LaneSnapshot(Finished(RunState.LOST, error="hermes-api no longer knows this run (its "
                                         "status expired, or the gateway lost it)"), terminal=True)
        if response.status_code != 200 or not isinstance(data, dict):
            raise LaneError(self._refusal("could not report the run", response, data))
        return LaneSnapshot(status_observation(data), pending_notes(data), is_terminal_status(data))

    # -- control -----------------------------------------------------------------------------------

    async def steer(self, ticket: RunTicket, text: str) -> None:
        features = await self._ensure_features()
        if not features.steer:
            raise LaneError("this Hermes api_server does not offer steering (run_steer); update Hermes "
                            "Agent, or stop the run instead")
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
        data = await self._control(ticket, "stop", None, "did not stop the run")
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
            raise LaneError("hermes-api no longer knows this run")
        raise LaneError(self._refusal(failed, response, data))

    async def reconcile(self, ticket: RunTicket) -> list[Observation]:
        """After a restart: re-submit an unconfirmed submission (same key: replayed, never doubled),
        then ask for the status. Unreachable → lost: its fate cannot be known from here."""
        observations: list[Observation] = []
        try:
            if not ticket.external_id:
                run_id = await self.start(ticket)
                observations.append(Accepted(run_id))
                ticket = _with_external(ticket, run_id)
            snapshot = await self.snapshot(ticket)
        except LaneError as exc:
            return [*observations, Finished(RunState.LOST, error=f"Switchboard restarted and could not ask "
                                                                  f"hermes-api about it: {exc}")]
        if snapshot is not None and snapshot.observation is not None:
            observations.append(snapshot.observation)
        return observations

    async def aclose(self) -> None:
        await self._streams.aclose()
        if self._own_client:
            await self._client.aclose()

    def _url(self, path: str) -> str:
        return self._base + path


def _with_external(ticket: RunTicket, run_id: str) -> RunTicket:
    return replace(ticket, external_id=run_id)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
