"""Every metric Switchboard exports, declared here and nowhere else (Prometheus text via prometheus-client).

Names start with `switchboard_` and carry their unit (`_seconds`, `_total`); labels only for small fixed
sets (a run's state); nothing per user, guild or call. The numbers are not pushed by the code that
counts them: at each scrape `Metrics.render` asks its `read` function for a `Reading` — gathered from
the counters the domains already keep (`bot.fleet.readings`) — and renders it from its own registry,
never prometheus-client's global one (which would also export this interpreter's GC and process
figures under names we do not own).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector, CollectorRegistry

from runs.core import RunState

log = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what generate_latest writes for our names; every Prometheus reads it
RUN_STATES = tuple(state.value for state in RunState)


@dataclass(frozen=True)
class Reading:
    """One scrape's numbers. Counters (`…_total`) only grow over the process's life; `runs` is None when
    the store could not be read (the family is then left empty rather than shown as zeros), and
    `listener_lag_s` None when no listener runs in this process."""

    ready: bool = False
    voice_calls: int = 0
    shards_held: int = 0
    turns_committed: int = 0
    late_ticks: int = 0
    frames_shed: int = 0
    provider_reconnects: int = 0
    provider_rollovers: int = 0
    runs: Mapping[str, int] | None = field(default_factory=dict)
    listener_lag_s: float | None = None
    lease_renewals_failed: int = 0


# name, type, help, the Reading field it shows
_SIMPLE = (
    ("switchboard_ready", "gauge", "1 while this process is ready and takes calls (/readyz 200), else 0", "ready"),
    ("switchboard_voice_calls", "gauge", "Discord voice calls live in this process", "voice_calls"),
    ("switchboard_shards_held", "gauge",
     "Discord gateway shards this process serves (no leases yet: one process holds all of its shards)",
     "shards_held"),
    ("switchboard_turns_committed_total", "counter", "speaker turns committed to the voice provider",
     "turns_committed"),
    ("switchboard_room_late_ticks_total", "counter",
     "20 ms room ticks that began more than one period late (the process could not keep up)", "late_ticks"),
    ("switchboard_room_frames_shed_total", "counter",
     "received audio frames dropped because a member's backlog was full", "frames_shed"),
    ("switchboard_provider_reconnects_total", "counter",
     "voice provider connections restored after a drop (a rollover that had to reconnect counts too)",
     "provider_reconnects"),
    ("switchboard_provider_rollovers_total", "counter",
     "voice provider sessions replaced by a fresh one before their time limit", "provider_rollovers"),
    ("switchboard_lease_renewals_failed_total", "counter",
     "shard lease renewals that failed (no leases yet: always 0)", "lease_renewals_failed"),
)
RUNS = ("switchboard_runs", "background runs in the store, by state (every process sharing the store sees the same)")
LISTENER_LAG = ("switchboard_listener_lag_seconds",
                "how long the oldest Smartnumbers event still being handled has waited (0: none)")
NAMES = (*(name for name, *_ in _SIMPLE), RUNS[0], LISTENER_LAG[0])


class Metrics:
    """`await render()` reads once and returns the exposition text (`CONTENT_TYPE`)."""

    def __init__(self, read: Callable[[], Awaitable[Reading]]) -> None:
        self._read = read
        self.reading = Reading()  # the last scrape's
        self.registry = CollectorRegistry()
        self.registry.register(_ReadingCollector(self))

    async def render(self) -> bytes:
        self.reading = await self._read()
        return generate_latest(self.registry)

    def families(self, reading: Reading | None) -> Iterator[Metric]:
        for name, kind, text, attribute in _SIMPLE:
            family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, text)
            if reading is not None:
                family.add_metric([], float(getattr(reading, attribute)))
            yield family
        runs = GaugeMetricFamily(RUNS[0], RUNS[1], labels=["state"])
        if reading is not None and reading.runs is not None:
            for state in RUN_STATES:
                runs.add_metric([state], float(reading.runs.get(state, 0)))
        yield runs
        lag = GaugeMetricFamily(*LISTENER_LAG)
        if reading is not None and reading.listener_lag_s is not None:
            lag.add_metric([], reading.listener_lag_s)
        yield lag


class _ReadingCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterator[Metric]:
        return self._metrics.families(None)

    def collect(self) -> Iterator[Metric]:
        return self._metrics.families(self._metrics.reading)
