"""`switchboard run`: the Discord bot, the runs service and the Smartnumbers listener, in one process.

Start-up refuses with one line per missing setting; a rejected token is said as such. While Discord
cannot be reached (the network is not up yet, an outage), it says so and retries with backoff
(1 s doubling to 60 s) until it can or is stopped. The listener starts once Discord is ready. With
SWITCHBOARD_HTTP_ADDR, `/healthz`, `/readyz` and `/metrics` are served from before the gateway opens until
the very end (`bot.fleet`): ready once Discord is connected. SIGINT and SIGTERM shut down in order —
`/readyz` turns 503 (draining), stop the listener, leave every call (tool outputs settle; its row is
marked to resume), stop watching runs, close the gateway normally (1000), close the store — and exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from itertools import count

import aiohttp
import discord

from bot.cli.args import EXIT_USAGE, serve_unless
from bot.discord.client import SwitchboardBot
from bot.discord.phone_cards import DiscordPoster
from bot.fleet.http import EndpointError
from bot.fleet.readiness import Readiness
from bot.fleet.readings import ProcessParts, serve_endpoints
from bot.phone.delivery import ListenerDelivery
from bot.phone.listener import KeySource
from bot.services import Services, build_services, stop_on_signals
from bot.settings import Settings, SettingsError, realtime_api_key
from common.store import StoreError
from voice.call.providers import ProviderConfigError, make_provider

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED = 0, 1
SHUTDOWN_BUDGET_S = 10.0
RESUME_HOLD_S = 60.0  # runs that finished while the service was down wait this long for its calls to be rejoined
LOGIN_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0)  # waits between log-in attempts; the last repeats
# What a retry can fix: no route or connection (OSError covers aiohttp's connector errors), a timeout, Discord's 5xx.
UNREACHABLE = (OSError, aiohttp.ClientError, asyncio.TimeoutError, discord.DiscordServerError)

# `pause(seconds, stopping)` waits between log-in attempts and is True when `stopping` was set meanwhile.
Pause = Callable[[float, asyncio.Event], Awaitable[bool]]


def missing_settings(settings: Settings) -> list[str]:
    """One line per setting `switchboard run` cannot start without."""
    problems = []
    if settings.discord_token is None or not settings.discord_token.get_secret_value():
        problems.append("DISCORD_BOT_TOKEN is not set: create a bot at https://discord.com/developers/applications "
                        "and put its token in .env (see README, 'Add the bot to your server')")
    try:
        realtime_api_key(settings)
        make_provider(settings.provider, api_key="check", model=settings.model, voice=settings.voice,
                      url=settings.realtime_url)
    except (SettingsError, ProviderConfigError) as exc:
        problems.append(str(exc))
    return problems


def run(settings: Settings, listener_key=None) -> int:
    """`listener_key` re-reads the Smartnumbers key at every connect (`bot.phone.listener.rotating_key`)."""
    return serve_unless("run", missing_settings(settings), lambda: serve(settings, listener_key=listener_key))


async def serve(settings: Settings, stopping: asyncio.Event | None = None,
                ready: asyncio.Future[SwitchboardBot] | None = None, listener_key: KeySource | None = None,
                readiness: Readiness | None = None, pause: Pause | None = None) -> int:
    """Run until SIGINT/SIGTERM (or `stopping` is set); `ready` gets the bot once it has logged in and
    synced its commands (interactions arrive once the gateway is READY, right after); `readiness` is
    what `/readyz` answers (its drain steps run when the shutdown begins). `pause` waits between log-in
    attempts (tests pass their own; default: the real wait, cut short by `stopping`)."""
    bot = SwitchboardBot(settings)
    bot.ready_future = ready
    stopping = stopping or asyncio.Event()
    readiness = readiness or Readiness("starting: not connected to Discord yet")
    try:
        async with build_services(settings, sink=bot.sink, poster=DiscordPoster(bot, settings.transcripts_channel_id),
                                  hold_delivery_s=RESUME_HOLD_S) as services:
            bot.attach(services)
            parts = ProcessParts(readiness, services.runs, bot.calls,
                                 gateway_up=lambda: bot.connected.is_set() and not bot.is_closed())
            async with serve_endpoints(settings.http_addr, parts):
                with stop_on_signals(stopping):
                    return await _serve(bot, services, stopping, listener_key, parts, pause or _pause)
    except (StoreError, EndpointError) as exc:
        print(f"switchboard run: {exc}", file=sys.stderr)
        return EXIT_USAGE


async def _serve(bot: SwitchboardBot, services: Services, stopping: asyncio.Event,
                 listener_key: KeySource | None, parts: ProcessParts, pause: Pause) -> int:
    code = EXIT_OK
    stream = parts.listener = _build_listener(services, listener_key)
    starting = None
    token = services.settings.discord_token.get_secret_value()  # type: ignore[union-attr]
    runner = asyncio.create_task(_start(bot, token, stopping, pause), name="discord")
    connected = asyncio.create_task(_ready_when_connected(bot, parts.readiness), name="readiness")
    try:
        if stream is not None:  # cards and results need the guilds: listen once Discord is ready
            starting = asyncio.create_task(_start_when_ready(bot, stream, services.delivery), name="listener-start")
        stop_wait = asyncio.create_task(stopping.wait())
        done, _ = await asyncio.wait({runner, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if runner in done:
            code = _start_failure(runner)
        stop_wait.cancel()
        connected.cancel()
        await parts.readiness.drain("draining: shutting down" if runner not in done
                                    else "stopping: the Discord connection ended")
        if starting is not None:
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        if stream is not None:  # no new calls while leaving; handlers still running are cancelled
            await stream.stop()
            stream = None
        await shutdown(bot, runner, before_gateway=services.runs.close)
    finally:
        if stream is not None:
            await stream.stop()
    return code


async def _start(bot: SwitchboardBot, token: str, stopping: asyncio.Event, pause: Pause) -> None:
    """`Client.start`, but a log-in that cannot reach Discord is said and retried with backoff (once
    logged in, discord.py reconnects by itself). Returns early when `stopping` is set during a wait."""
    for attempt in count():
        try:
            await bot.login(token)
            break
        except UNREACHABLE as exc:
            delay = LOGIN_BACKOFF_S[min(attempt, len(LOGIN_BACKOFF_S) - 1)]
            print(f"switchboard run: cannot reach Discord ({_reason(exc)}); retrying in {delay:g} s "
                  "(Ctrl-C to stop)", file=sys.stderr)
            await bot.http.close()  # the next attempt opens a new session and connector
            bot.http.connector = discord.utils.MISSING
            if await pause(delay, stopping):
                return
    if attempt:
        print("switchboard run: reached Discord", file=sys.stderr)
    await bot.connect(reconnect=True)


async def _pause(seconds: float, stopping: asyncio.Event) -> bool:
    try:
        await asyncio.wait_for(stopping.wait(), seconds)
    except TimeoutError:
        return False
    return True


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}" if str(exc) else type(exc).__name__


def _build_listener(services: Services, key: KeySource | None = None):
    """The Smartnumbers listener when it is configured; the log says so when not. (A malformed listener
    setting has already stopped the command, as every malformed setting does.)"""
    if services.settings.listener_key is None:
        log.info("Smartnumbers listener off: TRANSCRIPT_LISTENER_API_KEY is not set")
        return None
    return services.listener(key)


async def _ready_when_connected(bot: SwitchboardBot, readiness: Readiness) -> None:
    await bot.connected.wait()
    readiness.ready()


async def _start_when_ready(bot: SwitchboardBot, listener, delivery: ListenerDelivery) -> None:
    await bot.connected.wait()
    try:
        await listener.start()
        if posted := await delivery.flush_waiting():
            log.info("posted %d result(s) that were waiting for their call card", posted)
        if resumed := await listener.pipeline.resume():
            log.info("started the jobs of %d call(s) that a stop or crash had left without a run", len(resumed))
    except Exception as exc:  # said once, plainly; Discord and the runs keep going
        log.error("the Smartnumbers listener did not start: %s", exc)
        return
    log.info("Smartnumbers listener started")


def _start_failure(runner: asyncio.Task) -> int:
    exc = runner.exception() if not runner.cancelled() else None
    if isinstance(exc, discord.LoginFailure):
        print("switchboard run: Discord rejected the bot token (DISCORD_BOT_TOKEN): copy it again from the "
              "Developer Portal (Bot → Reset Token)", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(exc, discord.PrivilegedIntentsRequired):
        print("switchboard run: Discord refused the gateway intents", file=sys.stderr)
        return EXIT_FAILED
    if isinstance(exc, (discord.HTTPException, discord.GatewayNotFound, OSError)):
        print(f"switchboard run: Discord failed ({_reason(exc)})", file=sys.stderr)
        return EXIT_FAILED
    if exc is not None:
        log.error("the Discord client stopped", exc_info=exc)
        return EXIT_FAILED
    return EXIT_OK


async def shutdown(bot: SwitchboardBot, runner: asyncio.Task,
                   before_gateway: Callable[[], Awaitable[None]] | None = None) -> None:
    """Leave voice first (discord.py's own Ctrl-C path waits out the voice timeout; each call's row is
    marked `resume`, not ended: a deploy is not a goodbye), then stop watching runs (`before_gateway`: a
    run landing now is delivered at the next start, not lost to a closed gateway), then the gateway."""
    started = time.monotonic()
    bot.wrap_up.hurry()  # recaps post now, without waiting for a summary
    for task in bot.resuming:  # a call half rejoined is left like the others (its row stays to resume)
        task.cancel()
    await asyncio.gather(*bot.resuming, return_exceptions=True)
    try:
        await asyncio.wait_for(bot.calls.leave_all("Switchboard is shutting down", resume=True), SHUTDOWN_BUDGET_S / 2)
    except TimeoutError:
        log.warning("leaving the calls took longer than %.0f s", SHUTDOWN_BUDGET_S / 2)
    if before_gateway is not None:
        await before_gateway()
    # As `Client.run` does on Ctrl-C: cancel the running start(), then close(). A close() from
    # another task while start() still polls makes discord.py leave with 4000 instead of 1000.
    if not runner.done():
        runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    remaining = max(1.0, SHUTDOWN_BUDGET_S - (time.monotonic() - started))
    try:
        await asyncio.wait_for(bot.close(), remaining)
    except TimeoutError:
        log.warning("closing the Discord connection took too long")


