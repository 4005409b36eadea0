"""`switchboard run`: the Discord bot, the runs service and the Smartnumbers listener, in one process.

Start-up refuses with one line per missing setting; a rejected token is said as such. The listener
starts once Discord is ready. SIGINT and SIGTERM shut down in order — stop the listener, leave every
call (tool outputs settle), stop watching runs, close the gateway normally (1000), close the store —
and exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial

import discord
from discord import app_commands

from bot.compose import open_home_store, process_secrets, runs_config, stop_on_signals
from bot.listener_delivery import ListenerDelivery
from bot.runs import RunService
from bot.settings import Settings, SettingsError, realtime_api_key
from bot.store import Store, StoreError
from listener.commands import addresses_agent
from voice.call.identity import build_identity
from voice.call.providers import ProviderConfigError, make_provider

from .calls import CallManager, RoomOptions
from .commands import RunsGroup, TalkGroup
from .embeds import OK, WARN, info_embed
from .gate import OperatorGate
from .listener_commands import CallbacksGroup, TranscriptsGroup
from .listener_posts import DiscordPoster
from .notify import ChannelSink

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
SHUTDOWN_BUDGET_S = 10.0


def intents() -> discord.Intents:
    """Only what the service needs, nothing privileged: guilds (channels) and voice states (who is in
    voice, and to connect). Display names arrive with voice states and interactions."""
    wanted = discord.Intents.none()
    wanted.guilds = True
    wanted.voice_states = True
    return wanted


class SwitchboardBot(discord.Client):
    def __init__(self, settings: Settings) -> None:
        super().__init__(intents=intents())
        self.settings = settings
        self.tree = app_commands.CommandTree(self)
        self.gate = OperatorGate(settings.operator_user_ids)
        self.sink = ChannelSink(self, settings.runs_channel_id)
        self.runs: RunService | None = None
        self.store: Store | None = None  # set by serve before the gateway opens
        self.calls = CallManager(self, runs=lambda: self._runs(), gate=self.gate, provider=self._provider,
                                 identity=lambda memory: build_identity(settings.home, settings.identity_include, memory=memory),
                                 deaf_after_s=settings.deaf_after_s, idle_leave_s=settings.idle_leave_s,
                                 room=room_options(settings))
        self.tree.add_command(TalkGroup(self))
        self.tree.add_command(RunsGroup(self))
        self.tree.add_command(TranscriptsGroup(self))
        self.tree.add_command(CallbacksGroup(self))
        self.synced: list[str] = []
        self.connected = asyncio.Event()  # set at the first READY: the guilds are known
        self.ready_future: asyncio.Future[SwitchboardBot] | None = None

    def _runs(self) -> RunService:
        assert self.runs is not None, "the runs service starts before the bot"
        return self.runs

    def _provider(self):
        s = self.settings
        return make_provider(s.provider, api_key=realtime_api_key(s).get_secret_value(), model=s.model,
                             voice=s.voice, url=s.realtime_url)

    async def setup_hook(self) -> None:
        if self.settings.guild_ids:  # instant during development: guild commands need no propagation
            for guild_id in sorted(self.settings.guild_ids):
                guild = discord.Object(guild_id)
                self.tree.copy_global_to(guild=guild)
                commands = await self.tree.sync(guild=guild)
                self.synced.append(f"guild {guild_id}: {len(commands)} commands")
        else:
            commands = await self.tree.sync()
            self.synced.append(f"global: {len(commands)} commands")
        log.info("slash commands synced (%s)", "; ".join(self.synced))
        if self.ready_future is not None and not self.ready_future.done():
            self.ready_future.set_result(self)  # logged in and synced; the gateway opens next

    async def on_ready(self) -> None:
        self.connected.set()
        log.info("connected to Discord as %s (%s) in %d guild(s)", self.user, getattr(self.user, "id", "?"),
                 len(self.guilds))

    async def on_voice_state_update(self, member: discord.Member, before: discord.VoiceState,
                                    after: discord.VoiceState) -> None:
        self.calls.on_voice_state(member, before, after)

    async def status_embed(self, guild_id: int | None) -> discord.Embed:
        s = self.settings
        call = self.calls.get(guild_id) if guild_id is not None else None
        provider = f"{s.provider} {s.model or '(default model)'}, voice {s.voice or '(default)'}"
        if call is None:
            embed = info_embed("Call status", f"Not in a voice channel here. {provider}.")
        else:
            status = call.engine.status()
            heard = ", ".join(f"<@{u}> ({n} frames)" for u, n in sorted(call.transport.heard.items())) or "nobody yet"
            embed = info_embed("Call status", f"In <#{call.channel_id}> since <t:{int(call.started_at)}:R>. {provider}.",
                               colour=OK)
            embed.add_field(name="heard", value=heard[:1024], inline=False)
            receiver = call.voice.receiver
            if receiver is not None:
                counters = ", ".join(f"{k} {v}" for k, v in receiver.nonzero_stats().items()) or "none"
                embed.add_field(name="receiver", value=counters[:1024], inline=False)
                trouble = [f"<@{u}>: {h['state']} ({h.get('reason') or 'no audio'}, {h['failed']} packets lost)"
                           for u, h in sorted(receiver.member_health().items()) if h.get("state") != "ok"]
                if trouble:
                    embed.add_field(name="can't hear", value="\n".join(trouble)[:1024], inline=False)
                    embed.colour = WARN
            turns = [t for t in status.get("recent_turns", []) if t]
            if turns:
                lines = [", ".join(f"{name.replace('_', ' ')} {ms:.0f} ms" for name, ms in t.items()) for t in turns[-3:]]
                embed.add_field(name="last turns (from end of speech)", value="\n".join(lines)[:1024], inline=False)
            embed.add_field(name="voice activity", value=str(status.get("vad") or "server"), inline=True)
            embed.add_field(name="captions", value=(call.captions.status() if call.captions else "off")[:1024],
                            inline=True)
            audio = status.get("audio", {})
            counters = audio.get("counters", {})
            embed.add_field(name="answers", value=f"{audio.get('reply_to', 'everyone')}; {counters.get('turns', 0)} turns, "
                            f"{counters.get('unanswered', 0)} left unanswered, {counters.get('backchannels', 0)} "
                            f"backchannels, {counters.get('barge_ins', 0)} interruptions", inline=False)
        lanes = ", ".join(s.agent_lanes)
        embed.add_field(name="agent lanes", value=lanes, inline=True)
        embed.add_field(name="operators", value=str(len(self.gate.operators)) if self.gate.operators else
                        "none (SWITCHBOARD_OPERATOR_USER_IDS)", inline=True)
        if self.sink.last_failure is not None:
            failure = self.sink.last_failure
            embed.add_field(name="last run post failed", value=f"<t:{int(failure.at)}:R>: {failure.reason}"[:1024],
                            inline=False)
            embed.colour = WARN
        return embed


def room_options(settings: Settings) -> RoomOptions:
    """How calls treat the room; addressed mode uses the listener's direct-address rule (one implementation)."""
    addressed = partial(addresses_agent, agent_name=settings.agent_name, aliases=settings.activation_names)
    return RoomOptions(reply_to=settings.reply_to, followup_s=settings.followup_s,
                       min_interruption_ms=settings.min_interruption_ms, captions=settings.captions,
                       addressed=addressed, agent_name=settings.agent_name)


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
    """`listener_key` re-reads the Smartnumbers key at every connect (`bot.listen.rotating_key`)."""
    problems = missing_settings(settings)
    if problems:
        for line in problems:
            print(f"switchboard run: {line}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(serve(settings, listener_key=listener_key))
    except KeyboardInterrupt:
        return 130


async def serve(settings: Settings, stopping: asyncio.Event | None = None,
                ready: asyncio.Future[SwitchboardBot] | None = None, listener_key=None) -> int:
    """Run until SIGINT/SIGTERM (or `stopping` is set); `ready` gets the bot once it has logged in and
    synced its commands (interactions arrive once the gateway is READY, right after)."""
    bot = SwitchboardBot(settings)
    bot.ready_future = ready
    try:
        store = await open_home_store(settings)
    except StoreError as exc:
        print(f"switchboard run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    delivery = ListenerDelivery(store, bot.sink, DiscordPoster(bot, settings.transcripts_channel_id),
                                default_channel=settings.transcripts_channel_id)
    runs = RunService(store, runs_config(settings), sink=delivery, secrets=process_secrets(settings))
    bot.runs = runs
    bot.store = store
    bot.sink.record = lambda run_id, kind, detail: runs.repo.log(run_id, kind, detail, time.time())
    stopping = stopping or asyncio.Event()
    code = EXIT_OK
    stream = None
    starting = None
    try:
        with stop_on_signals(stopping):
            await runs.start()
            stream = _build_listener(settings, store, runs, delivery, listener_key)
            token = settings.discord_token.get_secret_value()  # type: ignore[union-attr]
            runner = asyncio.create_task(bot.start(token), name="discord")
            if stream is not None:  # cards and results need the guilds: listen once Discord is ready
                starting = asyncio.create_task(_start_when_ready(bot, stream, delivery), name="listener-start")
            stop_wait = asyncio.create_task(stopping.wait())
            done, _ = await asyncio.wait({runner, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if runner in done:
                code = _start_failure(runner)
            stop_wait.cancel()
            if starting is not None:
                starting.cancel()
                await asyncio.gather(starting, return_exceptions=True)
            if stream is not None:  # no new calls while leaving; handlers still running are cancelled
                await stream.stop()
                stream = None
            await shutdown(bot, runner, before_gateway=runs.close)
    finally:
        if stream is not None:
            await stream.stop()
        await runs.close()
        await store.close()
    return code


def _build_listener(settings: Settings, store, runs: RunService, notifier: ListenerDelivery, key=None):
    """The Smartnumbers listener when it is configured; one line says why when not."""
    from bot.listen import Listener, listener_problem

    if settings.listener_key is None:
        log.info("Smartnumbers listener off: TRANSCRIPT_LISTENER_API_KEY is not set")
        return None
    if problem := listener_problem(settings):
        print(f"switchboard run: the Smartnumbers listener does not start: {problem}", file=sys.stderr)
        return None
    return Listener(settings, store, runs, notifier=notifier, key=key)


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
        print(f"switchboard run: cannot reach Discord ({type(exc).__name__}: {str(exc)[:200]})", file=sys.stderr)
        return EXIT_FAILED
    if exc is not None:
        log.error("the Discord client stopped", exc_info=exc)
        return EXIT_FAILED
    return EXIT_OK


async def shutdown(bot: SwitchboardBot, runner: asyncio.Task,
                   before_gateway: Callable[[], Awaitable[None]] | None = None) -> None:
    """Leave voice first (discord.py's own Ctrl-C path waits out the voice timeout), then stop watching
    runs (`before_gateway`: a run landing now is delivered at the next start, not lost to a closed
    gateway), then the gateway."""
    started = time.monotonic()
    try:
        await asyncio.wait_for(bot.calls.leave_all("Switchboard is shutting down"), SHUTDOWN_BUDGET_S / 2)
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


