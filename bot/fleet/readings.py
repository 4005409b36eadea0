"""Where `/metrics` finds its numbers: read at each scrape from what each part already keeps, so the
domains (which never import `bot`) record nothing for it.

- calls (`CallManager.counts`): live calls, turns committed, frames shed, provider reconnects and
  rollovers — calls that ended are folded in when they end, so the totals only grow — and late room
  ticks (one room clock per process);
- runs (`RunRepository.count_by_state`): one `GROUP BY` over the store's runs, so every process sharing
  the store reports the same numbers; a store that cannot be read leaves the family empty (logged once);
- the listener (`StreamClient.stats.lag_s`): the oldest event still waiting for its ack;
- shards: the gateway session, up or not (no leases yet: one process holds every shard it serves).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

from bot.discord.calls import CallManager
from bot.fleet.http import HealthEndpoint, serving
from bot.fleet.metrics import Metrics, Reading
from bot.fleet.readiness import Readiness
from bot.phone.listener import Listener
from runs import RunService

log = logging.getLogger(__name__)


@dataclass
class ProcessParts:
    """What one process holds; `listener` is set once it is built (`switchboard run`: when configured)."""

    readiness: Readiness
    runs: RunService
    calls: CallManager | None = None
    gateway_up: Callable[[], bool] = lambda: False
    listener: Listener | None = None
    _store_failed: bool = field(default=False, repr=False)

    async def read(self) -> Reading:
        counts = self.calls.counts() if self.calls is not None else Counter()
        stream = self.listener.stream if self.listener is not None else None
        return Reading(
            ready=self.readiness.is_ready, voice_calls=len(self.calls.all()) if self.calls is not None else 0,
            shards_held=1 if self.gateway_up() else 0, turns_committed=counts["turns"],
            late_ticks=counts["late_ticks"], frames_shed=counts["frames_shed"],
            provider_reconnects=counts["reconnects"], provider_rollovers=counts["rollovers"],
            runs=await self._runs(), listener_lag_s=stream.stats.lag_s if stream is not None else None)

    async def _runs(self) -> dict[str, int] | None:
        try:
            counted = await self.runs.repo.count_by_state()
        except Exception as exc:  # the scrape still answers; the runs family is left empty, not zeroed
            if not self._store_failed:
                log.warning("/metrics: the runs could not be counted: %s", exc)
            self._store_failed = True
            return None
        self._store_failed = False
        return counted


def serve_endpoints(address: tuple[str, int] | None, parts: ProcessParts) -> AbstractAsyncContextManager:
    """`/healthz`, `/readyz` and `/metrics` for `parts` on SWITCHBOARD_HTTP_ADDR (None: off) until the block
    ends; raises `bot.fleet.http.EndpointError` (one line) when the address cannot be had."""
    return serving(address, HealthEndpoint(parts.readiness, Metrics(parts.read)))
