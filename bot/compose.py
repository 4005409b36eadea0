"""The composition root's shared pieces: settings → the store, the runs service, the archive.

Every command builds them here (`talk`, `runs`, `run`, `listen`, `transcripts`), so they all read
the same settings, open the same store with the same migrations, and stop on the same signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator

from listener.archive import MIGRATIONS as LISTENER_STEPS
from listener.archive import Archive

from .runs import MIGRATIONS, NotificationSink, RunsConfig, RunService
from .settings import SECRET_VARIABLES, Settings
from .store import Migration, Store, open_store

# The listener declares its tables as plain steps (it never imports the service); the store applies them.
LISTENER_MIGRATIONS = tuple(Migration(package, version, sql) for package, version, sql in LISTENER_STEPS)
STORE_MIGRATIONS = (*MIGRATIONS, *LISTENER_MIGRATIONS)


async def open_home_store(settings: Settings) -> Store:
    """The one store in SWITCHBOARD_HOME, with every package's tables. Raises StoreError (one line)."""
    return await open_store(settings.home, STORE_MIGRATIONS)


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
                      timeout_s=settings.agent_timeout_s, agent_env=settings.agent_env)


def process_secrets(settings: Settings) -> tuple[str, ...]:
    """Every key and token this process holds: scrubbed from all a run reports, never given to an agent."""
    held = (settings.discord_token, settings.openai_api_key, settings.xai_api_key, settings.hermes_api_key,
            settings.listener_key, settings.text_api_key)
    values = [v.get_secret_value() for v in held if v is not None]
    values += [os.environ.get(name, "").strip() for name in SECRET_VARIABLES]  # a key's other alias, too
    return tuple(dict.fromkeys(v for v in values if v))


@contextlib.asynccontextmanager
async def run_service(settings: Settings, sink: NotificationSink | None = None) -> AsyncIterator[RunService]:
    """The store in SWITCHBOARD_HOME and a started runs service over it; both closed on exit.

    Raises `bot.store.StoreError` (one line, says what to check) when the store cannot be opened."""
    store = await open_home_store(settings)
    service = RunService(store, runs_config(settings), sink=sink, secrets=process_secrets(settings))
    try:
        await service.start()
        yield service
    finally:
        await service.close()
        await store.close()


@contextlib.asynccontextmanager
async def archive(settings: Settings) -> AsyncIterator[Archive]:
    """The call archive in SWITCHBOARD_HOME's store (migrated), closed on exit. Raises StoreError."""
    store = await open_home_store(settings)
    try:
        yield Archive(store)
    finally:
        await store.close()
