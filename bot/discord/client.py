"""The Discord client: minimal intents, the slash-command tree, the calls it holds, and `/talk status`.

`bot.cli.run` builds it, gives it the services (`attach`) and starts it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot.discord.calls import CallManager, RoomOptions
from bot.discord.checks import on_command_error
from bot.discord.commands.callbacks import CallbacksGroup
from bot.discord.commands.runs import RunsGroup
from bot.discord.commands.talk import TalkGroup
from bot.discord.commands.transcripts import TranscriptsGroup
from bot.discord.embeds import OK, WARN, info_embed
from bot.discord.gate import OperatorGate
from bot.discord.resume import CallResumer
from bot.discord.runs_channel import ChannelSink
from bot.discord.wrap_up import CallWrapUp
from bot.settings import Settings, realtime_api_key, text_model_key
from common.store import Store
from common.text_model import TextModel, TextModelError
from listener.archive import Archive
from listener.callbacks import Callbacks
from listener.named_commands import addresses_agent
from runs import RunService
from voice.call.identity import build_identity
from voice.call.providers import make_provider

if TYPE_CHECKING:
    from bot.services import Services

log = logging.getLogger(__name__)


def intents() -> discord.Intents:
    """Only what the service needs, nothing privileged: guilds (channels) and voice states (who is in
    voice, and to connect). Display names arrive with voice states and interactions."""
    wanted = discord.Intents.none()
    wanted.guilds = True
    wanted.voice_states = True
    return wanted


class SwitchboardBot(discord.Client):
    """The Discord client; implements `bot.discord.commands.context.CommandContext` for the command groups."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(intents=intents())
        self.settings = settings
        self.tree = app_commands.CommandTree(self)
        self.gate = OperatorGate(settings.operator_user_ids)
        self.sink = ChannelSink(self, settings.runs_channel_id)
        self.services: Services | None = None  # given by `attach` before the gateway opens
        self.wrap_up = CallWrapUp(self, records=lambda: self._services().calls, runs=lambda: self.runs,
                                  model=self._text_model, operators=self.gate.operators)
        self.calls = CallManager(self, runs=lambda: self.runs, gate=self.gate, provider=self._provider,
                                 identity=lambda memory: build_identity(settings.home, settings.identity_include, memory=memory),
                                 deaf_after_s=settings.deaf_after_s, idle_leave_s=settings.idle_leave_s,
                                 max_minutes=settings.call_max_minutes,
                                 room=room_options(settings), records=lambda: self._services().calls,
                                 on_ended=self.wrap_up, home_guilds=settings.guild_ids)
        self.resumer = CallResumer(self.calls, records=lambda: self._services().calls)
        self.tree.on_error = on_command_error  # type: ignore[method-assign]  # one handler: refusals, failures
        self.tree.add_command(TalkGroup(self))
        self.tree.add_command(RunsGroup(self))
        self.tree.add_command(TranscriptsGroup(self))
        self.tree.add_command(CallbacksGroup(self))
        self.synced: list[str] = []
        self.connected = asyncio.Event()  # set once every server READY listed has arrived: the guilds are known
        self.ready_future: asyncio.Future[SwitchboardBot] | None = None
        self._text: TextModel | None = None
        self._text_problem: str | None = None
        self.resuming: set[asyncio.Task] = set()  # rejoining the calls the previous process was in, at start
        self._rejoining: set[asyncio.Task] = set()

    def attach(self, services: Services) -> None:
        """The services the commands and calls use; given before the gateway opens."""
        self.services = services
        self.sink.record = lambda run_id, kind, detail: services.runs.repo.log(run_id, kind, detail, time.time())

    def _services(self) -> Services:
        assert self.services is not None, "the services are attached before the gateway opens"
        return self.services

    @property
    def runs(self) -> RunService:
        return self._services().runs

    @property
    def store(self) -> Store:
        return self._services().store

    @property
    def archive(self) -> Archive:
        return self._services().archive

    @property
    def callbacks(self) -> Callbacks:
        return self._services().callbacks

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
        try:
            if resumable := await self.resumer.load():
                log.info("%d call(s) of the previous run to rejoin once Discord is ready", resumable)
        except Exception as exc:  # the bot still starts; those calls stay in the store for the next start
            log.error("could not read the calls of the previous run (none is rejoined): %s", exc)
        if self.ready_future is not None and not self.ready_future.done():
            self.ready_future.set_result(self)  # logged in and synced; the gateway opens next

    async def on_ready(self) -> None:
        self._all_here()

    async def on_guild_available(self, guild: discord.Guild) -> None:
        """A server's GUILD_CREATE (its channels and who is in voice): rejoin the call the previous process
        held there at once; once every server READY listed is here, the service is connected — without
        waiting out discord.py's READY delay (`guild_ready_timeout`, 2 s after the last server)."""
        if not self.connected.is_set():
            task = asyncio.create_task(self._resume_guild(guild), name=f"resume-{guild.id}")
            self.resuming.add(task)
            self._rejoining.add(task)
            if not any(g.unavailable for g in self.guilds):
                self._all_here()

    def _all_here(self) -> None:
        """Every server that will come at start has come (or READY gave up waiting): the listener may start,
        calls that were not rejoined end, held runs go out. Once."""
        if self.connected.is_set():
            return
        self.connected.set()
        log.info("connected to Discord as %s (%s) in %d guild(s)", self.user, getattr(self.user, "id", "?"),
                 len(self.guilds))
        self.resuming.add(asyncio.create_task(self._finish_resuming(), name="resume-calls"))

    async def _resume_guild(self, guild: discord.Guild) -> None:
        try:
            report = await self.resumer.resume_guild(guild)
        except Exception:
            log.exception("guild %s: rejoining the previous run's call failed", guild.id)
            return
        if report.rejoined or report.ended:
            log.info("guild %s: the previous run's calls: %d rejoined, %d ended", guild.id, len(report.rejoined),
                     len(report.ended))

    async def _finish_resuming(self) -> None:
        try:
            await asyncio.gather(*self._rejoining, return_exceptions=True)
            report = await self.resumer.end_unresumable()
            if report.ended:
                log.info("%d call(s) of the previous run ended: their servers were not available", len(report.ended))
        except Exception:
            log.exception("ending the previous run's calls failed")
        finally:  # runs that finished meanwhile are announced in the calls rejoined, then posted
            self.runs.release_delivery()

    def _text_model(self) -> TextModel | None:
        """The text model for recaps and debriefs, made at the first call that ends; None without a key."""
        if self._text is None and self._text_problem is None:
            key, source = text_model_key(self.settings)
            if key is None:
                self._text_problem = f"no text model key ({source})"
            else:
                try:
                    self._text = TextModel(self.settings.text_url, key, self.settings.text_model)
                except TextModelError as exc:
                    self._text_problem = str(exc)
            if self._text_problem is not None:
                log.info("call recaps have no summary and calls are not debriefed: %s", self._text_problem)
        return self._text

    async def close(self) -> None:
        # discord.py holds READY back in a task (`_delay_ready`, up to 2 s after the last server) that its
        # close() leaves running; we never wait for READY (`_all_here`), so a shutdown inside that window
        # had it dispatch `ready` to the closed client: "Task exception was never retrieved", a traceback.
        ready = getattr(self._connection, "_ready_task", None)
        if ready is not None and not ready.done():
            ready.cancel()
        await super().close()
        if self._text is not None:
            await self._text.aclose()


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
            embed.add_field(name="usage", value=call.usage().describe()[:1024], inline=False)
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
                       addressed=addressed, agent_name=settings.agent_name, rollover_s=settings.session_rollover_s)
