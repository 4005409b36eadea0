"""The composition root: settings in, every service a command uses out, closed in reverse order.

    async with build_services(settings, sink=..., poster=...) as services:
        services.runs, services.archive, services.callbacks, services.tokens, services.calls, services.listener(...)

Every command (`run`, `listen`, `talk`, `runs`, `transcripts`, `callbacks`) builds its services here,
so they all read the same settings, open the same store with every domain's migrations, give runs
the same secrets to withhold, and route finished runs the same way: a listener job's run to its
job's target (`bot.phone.delivery`), every other run to the command's `sink` (a Discord channel, the
terminal). `doctor` alone builds nothing: it only reads (`common.store.check_store`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from bot.phone.delivery import ListenerDelivery, ResultPoster, TerminalPoster
from bot.settings import SECRET_VARIABLES, Settings
from common.store import Store, open_store
from listener.archive import Archive
from listener.callbacks import Callbacks, MutationTokens
from listener.repository import MIGRATIONS as LISTENER_MIGRATIONS
from runs import MIGRATIONS, NotificationSink, RunsConfig, RunService, TerminalSink
from runs.lanes import Lane
from voice.call.records import MIGRATIONS as VOICE_MIGRATIONS
from voice.call.records import CallRecords

STORE_MIGRATIONS = (*MIGRATIONS, *LISTENER_MIGRATIONS, *VOICE_MIGRATIONS)
AGENT_WORKDIR = "agent-work"  # the command lane's agent starts in SWITCHBOARD_HOME/agent-work


async def open_home_store(settings: Settings, *, create: bool = True, read_only: bool = False) -> Store:
    """The one store — in PostgreSQL when SWITCHBOARD_DATABASE_URL is set, else in SWITCHBOARD_HOME — with
    every package's tables; `create=False` for a command that only reads or stops (no store there is then
    an error, not a new one), `read_only` for one that only reads (in SQLite it then works in a home it
    cannot write, and writes nothing there). Raises StoreError (one line)."""
    return await open_store(settings.home, STORE_MIGRATIONS, database_url=database_url(settings), create=create,
                            read_only=read_only)


def database_url(settings: Settings) -> str | None:
    """SWITCHBOARD_DATABASE_URL, or None: the store is SQLite in SWITCHBOARD_HOME."""
    return settings.database_url.get_secret_value() if settings.database_url is not None else None


@contextlib.contextmanager
def stop_on_signals(stopping: asyncio.Event) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM set `stopping` (the service then shuts down in order)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def runs_config(settings: Settings) -> RunsConfig:
    """SWITCHBOARD_AGENT_* and SWITCHBOARD_HERMES_* as the runs service's configuration."""
    key = settings.hermes_api_key.get_secret_value() if settings.hermes_api_key is not None else None
    return RunsConfig(lanes=settings.agent_lanes, hermes_url=settings.hermes_api_url, hermes_key=key,
                      command=settings.agent_command, profile=settings.agent_profile,
                      timeout_s=settings.agent_timeout_s, agent_env=settings.agent_env,
                      workdir=settings.home / AGENT_WORKDIR, hermes_max_runs=settings.hermes_max_concurrent_runs)


def process_secrets(settings: Settings) -> tuple[str, ...]:
    """Every key and token this process holds: scrubbed from all a run reports, never given to an agent."""
    held = (settings.discord_token, settings.openai_api_key, settings.xai_api_key, settings.hermes_api_key,
            settings.listener_key, settings.text_api_key)
    values = [v.get_secret_value() for v in held if v is not None]
    if password := _password(database_url(settings)):
        values.append(password)  # the URL itself is one of SECRET_VARIABLES
    values += [os.environ.get(name, "").strip() for name in SECRET_VARIABLES]  # a key's other alias, too
    return tuple(dict.fromkeys(v for v in values if v))


def _password(url: str | None) -> str | None:
    try:
        password = urlsplit(url).password if url else None
    except ValueError:  # a malformed port: opening the store says so
        return None
    return unquote(password) if password else None


@dataclass
class Services:
    """What a command works with, all over one store. `runs` is started (it reconciles tickets left by
    a crash) unless the command only reads; `delivery` is the runs' sink."""

    settings: Settings
    store: Store
    runs: RunService
    delivery: ListenerDelivery

    @property
    def archive(self) -> Archive:
        return Archive(self.store)

    @property
    def callbacks(self) -> Callbacks:
        return Callbacks(self.store)

    @property
    def calls(self) -> CallRecords:
        """Voice calls and their recent turns (`voice.call.records`)."""
        return CallRecords(self.store)

    @property
    def tokens(self) -> MutationTokens:
        return MutationTokens(self.store)

    def listener(self, key: Callable[[], str | None] | None = None):
        """The Smartnumbers listener over these services (its jobs become runs, delivered by `delivery`)."""
        from bot.phone.listener import Listener

        return Listener(self.settings, self.store, self.runs, notifier=self.delivery, key=key)


@contextlib.asynccontextmanager
async def build_services(settings: Settings, *, sink: NotificationSink | None = None,
                         poster: ResultPoster | None = None, watch_runs: bool = True,
                         config: RunsConfig | None = None, lanes: Sequence[Lane] | None = None,
                         clock: Callable[[], float] = time.time,
                         sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                         hold_delivery_s: float = 0.0, create_store: bool = True,
                         read_only: bool = False) -> AsyncIterator[Services]:
    """Open the store in SWITCHBOARD_HOME, start the runs service over it, and close both on exit.

    `sink` gets finished runs that are not a listener job's (default: the terminal); `poster` posts
    listener results (default: the terminal). `watch_runs=False` is for commands that only read or
    stop runs (`switchboard runs`): nothing is followed or delivered, and closing leaves the store as
    it was. `config` replaces the runs configuration read from settings; `lanes`, `clock` and `sleep`
    are for tests; `hold_delivery_s` holds finished runs until `services.runs.release_delivery()` (the
    Discord service: until it has rejoined its calls); `create_store=False` for commands that only read
    or stop (no store in SWITCHBOARD_HOME is then an error); `read_only` for commands that only read
    (with `watch_runs=False`: nothing is written, not even beside the file). Raises
    `common.store.StoreError` (one line, says what to check)."""
    store = await open_home_store(settings, create=create_store, read_only=read_only)
    delivery = ListenerDelivery(store, sink or TerminalSink(), poster or TerminalPoster(),
                                default_channel=settings.transcripts_channel_id)
    runs = RunService(store, config or runs_config(settings), sink=delivery, lanes=lanes, clock=clock, sleep=sleep,
                      watch=watch_runs, secrets=process_secrets(settings), hold_delivery_s=hold_delivery_s)
    try:
        await runs.start()
        yield Services(settings, store, runs, delivery)
    finally:
        await runs.close(settle_unwatchable=watch_runs)
        await store.close()
