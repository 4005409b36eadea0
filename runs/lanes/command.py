"""The command lane: a detached one-shot agent process (default `hermes -z {task}`), no shell, started in a
work folder of its own (`RunsConfig.workdir`), never in Switchboard's working folder beside its `.env`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path

from runs.agent_command import (
    TemplateError,
    build_argv,
    check_template,
    child_environment,
    program_on_path,
    resolve_profile,
)
from runs.capture import CappedOutput
from runs.config import RunsConfig
from runs.core import Finished, Observation, RunState, RunTicket
from runs.lanes.base import Emit, LaneError, LaneProbe, LaneSnapshot
from runs.procs import process_token, same_process

log = logging.getLogger(__name__)

NAME = "command"
STDERR_CAP = 4096
POLL_STEP_S = 0.05
NO_STEERING = ("run {id} is a one-shot command, which has no way to pass a note to a running agent; "
               "I can stop it instead")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _last_lines(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " / ".join(lines[-3:])[-limit:]


async def _first(*aws: Awaitable) -> None:
    """Wait until the first of `aws` finishes; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class CommandLane:
    """Spawns the agent in its own session (its own process group) and reads its output, capped."""

    name = NAME

    def __init__(self, config: RunsConfig, *, env: Mapping[str, str] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, withhold: Iterable[str] = ()) -> None:
        self._config = config
        self._env = dict(os.environ if env is None else env)
        self._withhold = tuple(s for s in withhold if s)  # values no variable the agent sees may carry
        self._sleep = sleep
        self._workdir = config.workdir  # None: a private temporary folder, made at the first start
        self._temporary = config.workdir is None
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._reapers: set[asyncio.Task] = set()

    @property
    def program(self) -> str:
        return self._config.command[0] if self._config.command else ""

    async def probe(self) -> LaneProbe:
        try:
            check_template(self._config.command)
        except TemplateError as exc:
            return LaneProbe(NAME, False, "the agent command is not usable", str(exc))
        if program_on_path(self._config.command, self._env) is None:
            reason = f"`{self.program}` was not found on PATH"
            return LaneProbe(NAME, False, reason,
                             f"{reason}: install Hermes Agent, or set SWITCHBOARD_AGENT_COMMAND to an agent "
                             f"CLI whose arguments contain {{task}}")
        return LaneProbe(NAME, True, can_steer=False)

    def can_steer(self) -> bool:
        return False

    def argv(self, task: str) -> list[str]:
        profile = resolve_profile(self._config.command, self._config.profile, self._config.hermes_home)
        return build_argv(self._config.command, task, profile)

    def environment(self) -> dict[str, str]:
        """What the agent process is given (the allow-list; see `agent_command.child_environment`)."""
        return child_environment(self._env, self._config.agent_env, self._withhold)

    def workdir(self) -> Path:
        """The folder the agent starts in, made owner-only (0700) when missing. Raises LaneError."""
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="switchboard-agent-"))
        try:
            self._workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise LaneError(f"cannot use the agent's work folder {self._workdir}: "
                            f"{exc.strerror or type(exc).__name__}") from None
        return self._workdir

    async def start(self, ticket: RunTicket) -> str:
        try:
            argv = self.argv(ticket.task)
            if os.sep in argv[0] and not os.path.isabs(argv[0]):  # `./agent`: from where Switchboard started,
                argv[0] = os.path.abspath(argv[0])  # not from the agent's work folder
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=self.environment(), cwd=self.workdir(),
                start_new_session=True)  # its own process group: stop reaches every child it spawns
        except TemplateError as exc:
            raise LaneError(str(exc)) from None
        except OSError as exc:
            raise LaneError(f"could not start `{self.program}` (SWITCHBOARD_AGENT_COMMAND): "
                            f"{exc.strerror or type(exc).__name__}") from None
        self._procs[ticket.id] = proc
        log.info("run %s: started `%s` as pid %s", ticket.id, self.program, proc.pid)
        return process_token(proc.pid)

    async def follow(self, ticket: RunTicket, emit: Emit) -> None:
        proc = self._procs.get(ticket.id)
        if proc is None:
            await emit(Finished(RunState.LOST, error="this process no longer holds the run's process"))
            return
        out = CappedOutput(self._config.output_cap_bytes)
        err = CappedOutput(STDERR_CAP)
        pumps = [asyncio.create_task(self._pump(proc.stdout, out)),
                 asyncio.create_task(self._pump(proc.stderr, err))]
        try:
            returncode = await proc.wait()
            # a child that inherited the pipes may keep them open: drain briefly, then let go
            await _first(asyncio.gather(*pumps), self._sleep(self._config.stop_grace_s))
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._procs.pop(ticket.id, None)
        output = out.text()
        if returncode == 0:
            await emit(Finished(RunState.COMPLETED, output=output, output_cut=bool(out.cut)))
        elif returncode < 0:
            await emit(Finished(RunState.FAILED, output=output or None, output_cut=bool(out.cut),
                                error=f"the agent process was killed ({_signal_name(-returncode)})",
                                interrupted=True))
        else:
            detail = _last_lines(err.text()) or "no error output"
            await emit(Finished(RunState.FAILED, output=output or None, output_cut=bool(out.cut),
                                error=f"`{self.program}` exited with status {returncode}: {detail}"))

    @staticmethod
    async def _pump(stream: asyncio.StreamReader | None, sink: CappedOutput) -> None:
        if stream is None:
            return
        while chunk := await stream.read(65536):
            sink.feed(chunk)

    async def snapshot(self, ticket: RunTicket) -> LaneSnapshot | None:
        return None

    async def steer(self, ticket: RunTicket, text: str) -> None:
        raise LaneError(NO_STEERING.format(id=ticket.id))

    async def answer(self, ticket: RunTicket, request_id: str | None, choice: str) -> None:
        raise LaneError("a one-shot command never asks for approval (the agent runs with approvals bypassed)")

    async def stop(self, ticket: RunTicket) -> str:
        """SIGTERM to the whole process group now; SIGKILL to whatever is left after the grace period."""
        proc = self._procs.get(ticket.id)
        if proc is not None:
            pgid = proc.pid
            alive = proc.returncode is None
        else:
            token = ticket.external_id or ""
            if not same_process(token):
                raise LaneError("its process is no longer running")
            pgid, alive = int(token.partition(":")[0]), True
        if not alive:
            return "already exited"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        reaper = asyncio.create_task(self._kill_after_grace(pgid, proc, ticket.external_id or ""))
        self._reapers.add(reaper)
        reaper.add_done_callback(self._reapers.discard)
        return "stopping"

    async def _kill_after_grace(self, pgid: int, proc: asyncio.subprocess.Process | None, token: str) -> None:
        if proc is not None:
            await _first(proc.wait(), self._sleep(self._config.stop_grace_s))
        else:  # not our child (e.g. `switchboard runs stop`): watch its identity instead of waiting on it
            steps = max(1, int(self._config.stop_grace_s / POLL_STEP_S))
            for _ in range(steps):
                if not same_process(token):
                    break
                await self._sleep(POLL_STEP_S)
        # the group id cannot be reused while any member is alive, so this reaches only stragglers
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)

    async def wait_stopped(self) -> None:
        """Wait for pending SIGKILL follow-ups (tests, CLI)."""
        if self._reapers:
            await asyncio.gather(*list(self._reapers), return_exceptions=True)

    async def reconcile(self, ticket: RunTicket) -> list[Observation]:
        still = " (its process still runs, but its output cannot be read)" if (
            ticket.external_id and same_process(ticket.external_id)) else ""
        return [Finished(RunState.LOST, error="Switchboard restarted while it ran; a detached process cannot "
                                              f"be re-attached, so its result is gone{still}")]

    async def aclose(self) -> None:
        for reaper in list(self._reapers):
            reaper.cancel()
        await asyncio.gather(*list(self._reapers), return_exceptions=True)
        if self._temporary and self._workdir is not None:  # the temporary folder goes when the agents left it empty
            with contextlib.suppress(OSError):
                self._workdir.rmdir()
