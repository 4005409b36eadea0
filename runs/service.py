"""The runs service: durable tickets, lanes tried in order, watchers, approvals, receipts, delivery.

Every decision about a run's state is `core.advance`; this module does the I/O around it: it records
a ticket before asking a lane, feeds what lanes report through the core inside one write transaction,
and carries out the effects (ask a question, stop on the lane, deliver a finished run once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import replace
from typing import Any

from common.store import Store
from common.tasks import BackgroundTasks
from runs import wording
from runs.capture import Scrubber, cap_text
from runs.config import RunsConfig
from runs.core import (
    VOICE_APPROVAL_CHOICES,
    Accepted,
    ApprovalAnswered,
    AskApproval,
    Finished,
    Observation,
    RunState,
    RunTicket,
    Settle,
    SteerReceipt,
    SteerState,
    StopOnLane,
    StopRequested,
    advance,
    receipt_on_finish,
    receipt_on_pending,
    receipt_on_stop,
)
from runs.lanes import AlreadyEnded, CommandLane, HermesApiLane, Lane, LaneError, LaneProbe, SubmitUnknown
from runs.procs import elsewhere, owner_alive, owner_token
from runs.repository import MIGRATIONS, RunRepository
from runs.results import (
    Answered,
    Delegated,
    NoteQueued,
    Refused,
    RunningAgents,
    RunsOverview,
    RunStatus,
    StopOutcome,
    Stopped,
)
from runs.sinks import Announcer, NotificationSink, NullSink

log = logging.getLogger(__name__)

CHECK_OUTPUT_CHARS = 1500
RECENT_FINISHED = 3


class UnknownRun(LookupError):
    """No run has that number."""

    def __init__(self, run_id: Any) -> None:
        super().__init__(f"there is no run {run_id}")
        self.run_id = run_id


def default_lanes(config: RunsConfig, sleep: Callable[[float], Awaitable[None]], *,
                  secrets: Iterable[str] = ()) -> list[Lane]:
    """The lanes `config` names; `secrets` are values the agent's environment never carries."""
    return [HermesApiLane(config, sleep=sleep), CommandLane(config, sleep=sleep, withhold=secrets)]


def _scrub_with(obs: Observation, scrub: Scrubber) -> Observation:
    """The observation with `scrub` applied to its text fields (strings, and strings inside tuples)."""
    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return scrub(value)
        if isinstance(value, tuple):
            return tuple(clean(v) for v in value)
        return value

    changes = {name: cleaned for name, value in vars(obs).items() if (cleaned := clean(value)) != value}
    return replace(obs, **changes) if changes else obs


def _scrub(obs: Observation, secrets: Sequence[str] = ()) -> Observation:
    """The observation with every secret (whole or any piece of it, see `capture.Scrubber`), and
    anything shaped like a mutation token, replaced in its text fields."""
    return _scrub_with(obs, Scrubber(secrets))


def _already(ticket: RunTicket) -> Delegated:
    return Delegated(ticket.id, ticket.lane, ticket.state, f"run {ticket.id} was already started on {ticket.lane}",
                     already=True)


def _state_event(before: RunTicket, after: RunTicket) -> tuple[str, str] | None:
    if before.state != after.state:
        detail = f"{before.state.value} -> {after.state.value}"
        if after.error and after.terminal:
            detail += f": {after.error}"
        elif after.external_id and before.external_id != after.external_id:
            detail += f" as {after.external_id}"
        return "state", detail
    if after.stop is not None and before.stop != after.stop:
        return "stop", f"{after.stop.kind}: {after.stop.reason}"
    return None


class RunService:
    """Background runs for voice tools, the CLI and (later) the Discord service.

    `watch=False` is the CLI's mode: it reads and stops runs but never reconciles, follows or
    delivers them (the running service owns that). `sleep` and `clock` are injected so tests never
    wait for real; `clock` is wall time because it is stored and compared across restarts.

    `secrets`: every key and token this process holds (the composition root passes all it was
    configured with; the Hermes key in `config` is added here). Neither they, nor any piece of one
    `capture.SECRET_PIECE_CHARS` long, nor a run's own secrets (`delegate(scrub=...)`) are ever
    stored, spoken, posted or answered; and the command lane never hands them to an agent.
    """

    def __init__(self, store: Store, config: RunsConfig, *, lanes: Sequence[Lane] | None = None,
                 sink: NotificationSink | None = None, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, owner: str | None = None,
                 watch: bool = True, secrets: Iterable[str | None] = (), hold_delivery_s: float = 0.0) -> None:
        """`hold_delivery_s`: finished runs wait up to this long for `release_delivery()` before they are
        delivered — the Discord service holds them until it has rejoined the calls it was in, so a run
        that finished while it was down is announced in the call, not only posted."""
        self.store = store
        self.config = config
        self.repo = RunRepository(store)
        self._scrubber = Scrubber(s for s in (*secrets, config.hermes_key) if s)
        self.lanes: dict[str, Lane] = {lane.name: lane for lane in (
            lanes or default_lanes(config, sleep, secrets=self._scrubber.secrets))}
        self.owner = owner or owner_token()
        self._sink = sink or NullSink()
        self._clock = clock
        self._sleep = sleep
        self._watch = watch
        self._announcers: list[Announcer] = []
        self._tasks = BackgroundTasks(log, "runs task")
        self._approval_timers: dict[int, asyncio.Task] = {}
        self._changed = asyncio.Condition()
        self._run_secrets: dict[int, tuple[str, ...]] = {}  # runs with secrets of their own, until they settle
        self._run_scrubbers: dict[int, Scrubber] = {}
        self._closed = False
        self._hold_delivery_s = hold_delivery_s
        self._deliverable = asyncio.Event()
        self.held = 0  # finished runs waiting for `release_delivery`
        if hold_delivery_s <= 0:
            self._deliverable.set()

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Apply the runs migrations; when watching, reconcile runs a previous process left behind and
        deliver finished runs nobody delivered."""
        await self.store.migrate(MIGRATIONS)
        if not self._watch:
            return
        owners, active = await self.repo.claim_owners(), await self.repo.active()
        # another host's processes: alive while connected to a shared server (asked only when there are any)
        sessions = await self.store.sessions() if elsewhere([*owners, *(t.owner for t in active)]) else None
        dead = [o for o in owners if not owner_alive(o, me=self.owner, sessions=sessions)]
        if dead:
            await self.repo.release_claims(dead)
        orphans = [t for t in active if not owner_alive(t.owner, me=self.owner, sessions=sessions)]
        await asyncio.gather(*(self._reconcile(t) for t in orphans))
        for run_id in await self.repo.undelivered():
            self._spawn(self._deliver(run_id), f"deliver-{run_id}")

    async def close(self, *, settle_unwatchable: bool = True) -> None:
        """Stop watching. Runs keep going on their lanes; api runs are reconciled at the next start.
        With `settle_unwatchable`, command runs this instance watched are marked lost now (nobody can
        read their output any more). False leaves the store exactly as a crash would. A second call
        does nothing."""
        if self._closed:
            return
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if settle_unwatchable:
            for ticket in await self.repo.active():
                if ticket.owner == self.owner and ticket.lane == CommandLane.name:
                    await self._observe(ticket.id, Finished(
                        RunState.LOST, error="Switchboard stopped while it ran; a detached process cannot be "
                                             "re-attached, so its result is gone"), effects=False)
        for lane in self.lanes.values():
            await lane.aclose()

    @property
    def busy(self) -> bool:
        """True while this instance is still watching, asking about or delivering a run."""
        return self._tasks.busy

    def attach(self, announcer: Announcer) -> Callable[[], None]:
        """Register a live call; finished runs and questions are spoken to every registered call.
        Returns the function that unregisters it."""
        self._announcers.append(announcer)
        return lambda: self.detach(announcer)

    def detach(self, announcer: Announcer) -> None:
        if announcer in self._announcers:
            self._announcers.remove(announcer)

    # -- delegate ----------------------------------------------------------------------------------

    async def delegate(self, task: str, requester_id: int | None = None, *, context: str = "",
                       scrub: Sequence[str] = (), idempotency_key: str | None = None,
                       origin: str | None = None) -> Delegated | Refused:
        """Record a ticket on the first available lane and return at once; the lane is asked in the
        background. Every lane skipped is named in the answer; none available (or no task) → `Refused`.

        `context` goes to the agent after the task when the run starts and is never stored or shown
        (a call's transcript, a short-lived token). Each string in `scrub` is scrubbed from everything the
        run reports before it is stored, spoken or posted.

        `idempotency_key`: one key, one run — asked again with it (a retry after a crash, another
        process), this answers with the run first recorded under it and starts nothing.

        `origin`: what asked for the run (a voice call's id), stored with it for `tickets_of`; blank is None."""
        task = (task or "").strip()
        if not task:
            return Refused("say what the background agent should do")
        if idempotency_key and (known := await self.repo.by_idempotency_key(idempotency_key)) is not None:
            return _already(known)
        probes: list[LaneProbe] = []
        chosen: Lane | None = None
        for name in self.config.lanes:
            lane = self.lanes.get(name)
            if lane is None:
                continue
            probe = await lane.probe()
            probes.append(probe)
            if probe.available:
                chosen = lane
                break
        if chosen is None:
            missing = "; ".join(f"{p.lane}: {p.detail}" for p in probes) or "no lanes are configured"
            return Refused(f"no agent lane is available, so nothing was started. {missing}")
        own = tuple(s for s in scrub if s)
        scrubber = self._scrubber.with_secrets(own) if own else self._scrubber
        ticket, created = await self.repo.create_once(
            lane=chosen.name, task=scrubber(task), requester_id=requester_id, owner=self.owner,
            idempotency_key=idempotency_key or f"switchboard-{secrets.token_hex(16)}", now=self._clock(),
            origin=(origin or "").strip() or None)
        if not created:  # another process recorded it in the meantime: that run is this one
            return _already(ticket)
        if own:
            self._run_secrets[ticket.id] = own
        self._spawn(self._run(ticket, context), f"run-{ticket.id}")
        skipped = [p for p in probes if not p.available]
        summary = f"run {ticket.id} is starting on {chosen.name}"
        if skipped:
            summary = f"{', and '.join(p.reason for p in skipped)}, so run {ticket.id} is starting on the " \
                      f"{chosen.name} lane"
        return Delegated(ticket.id, chosen.name, ticket.state, summary + "; I'll say when it lands.",
                         skipped=tuple(p.detail for p in skipped))

    async def _run(self, ticket: RunTicket, context: str = "") -> None:
        lane = self.lanes[ticket.lane]
        sent = replace(ticket, task=f"{ticket.task}\n\n{context}") if context else ticket
        try:
            if isinstance(lane, HermesApiLane):  # it may queue the run first, and says so
                external_id = await lane.start(sent, lambda obs: self._observe(ticket.id, obs))
            else:
                external_id = await lane.start(sent)
        except SubmitUnknown as exc:
            await self._observe(ticket.id, Finished(RunState.LOST, error=f"its start is unknown: {exc}"))
            return
        except LaneError as exc:
            await self._observe(ticket.id, Finished(RunState.FAILED, error=f"{lane.name} could not start it: {exc}"))
            return
        await self._observe(ticket.id, Accepted(external_id))
        await self._follow(ticket.id)

    async def _follow(self, run_id: int) -> None:
        ticket = await self.repo.get(run_id)
        if ticket is None or not ticket.active:
            return
        lane = self.lanes[ticket.lane]
        remaining = self.config.timeout_s - (self._clock() - ticket.created_at)
        watchdog = self._spawn(self._watchdog(run_id, max(0.0, remaining)), f"watchdog-{run_id}")
        try:
            await lane.follow(ticket, lambda obs: self._observe(run_id, obs))
        except LaneError as exc:
            await self._observe(run_id, Finished(RunState.LOST, error=f"lost track of it: {exc}"))
        except Exception as exc:  # a watcher bug must not leave the run "running" forever
            log.exception("run %s: watcher failed", run_id)
            await self._observe(run_id, Finished(RunState.LOST, error=f"its watcher failed ({type(exc).__name__})"))
        finally:
            watchdog.cancel()
        after = await self.repo.get(run_id)
        if after is not None and after.active:
            await self._observe(run_id, Finished(RunState.LOST, error=f"{lane.name} stopped reporting on it"))

    async def _watchdog(self, run_id: int, delay: float) -> None:
        await self._sleep(delay)
        ticket = await self.repo.get(run_id)
        if ticket is None or not ticket.active:
            return
        reason = f"it ran past its {wording.elapsed_words(self.config.timeout_s)} budget"
        await self._observe(run_id, StopRequested(reason, kind="timeout"))
        try:
            await self.lanes[ticket.lane].stop(ticket)
        except LaneError as exc:
            await self._observe(run_id, Finished(RunState.FAILED, error=f"{reason}, and stopping it failed: {exc}"))

    # -- observations → core → effects -------------------------------------------------------------

    def add_secrets(self, values: Iterable[str | None]) -> None:
        """Secrets this process learned after it started (a key rotated in `.env` and read again):
        from now on they are scrubbed like the ones given to the constructor."""
        self._scrubber = self._scrubber.with_secrets(v for v in values if v)
        self._run_scrubbers.clear()

    def _scrub_for(self, run_id: int) -> Scrubber:
        own = self._run_secrets.get(run_id)
        if not own:
            return self._scrubber
        if run_id not in self._run_scrubbers:
            self._run_scrubbers[run_id] = self._scrubber.with_secrets(own)
        return self._run_scrubbers[run_id]

    async def _log(self, run_id: int, kind: str, detail: str) -> None:
        await self.repo.log(run_id, kind, self._scrub_for(run_id)(detail), self._clock())

    async def _observe(self, run_id: int, obs: Observation, *, effects: bool = True) -> RunTicket | None:
        now = self._clock()
        if isinstance(obs, Finished) and obs.output:  # cut first: the scrubber also finds the pieces a cut left
            output, cut = cap_text(obs.output, self.config.output_cap_bytes)
            obs = replace(obs, output=output, output_cut=obs.output_cut or cut)
        obs = _scrub_with(obs, self._scrub_for(run_id))
        steps = []

        def change(ticket: RunTicket) -> RunTicket:
            step = advance(ticket, obs, now, approval_timeout_s=self.config.approval_timeout_s)
            steps.append(step)
            return step.ticket

        result = await self.repo.update(run_id, change, event=_state_event, now=now)
        if result is None or not steps:
            return None
        before, after = result
        if after.terminal:  # its last report is stored: nothing more of this run is recorded
            self._run_secrets.pop(run_id, None)
            self._run_scrubbers.pop(run_id, None)
        if before.approval is not None and after.approval != before.approval:
            timer = self._approval_timers.pop(run_id, None)
            if timer is not None and timer is not asyncio.current_task():
                timer.cancel()
        await self._notify()
        if not effects:
            return after
        for effect in steps[-1].effects:
            if isinstance(effect, AskApproval):
                self._ask(after, effect)
            elif isinstance(effect, StopOnLane):
                self._spawn(self._stop_on_lane(run_id), f"stop-{run_id}")
            elif isinstance(effect, Settle):
                await self._settle_receipts(after)
                self._spawn(self._deliver(run_id), f"deliver-{run_id}")
        if after.active and before.active and not isinstance(obs, Finished):
            await self._check_notes(after)
        return after

    async def _check_notes(self, ticket: RunTicket) -> None:
        """Ask the lane for the run's unread notes while a receipt is queued: the only landing proof."""
        receipts = await self.repo.receipts(ticket.id)
        if not any(r.state is SteerState.QUEUED for r in receipts):
            return
        try:
            snapshot = await self.lanes[ticket.lane].snapshot(ticket)
        except LaneError:
            return
        if snapshot is None:
            return
        now = self._clock()
        if await self.repo.update_receipts(ticket.id, lambda r: receipt_on_pending(r, snapshot.pending_notes, now)):
            await self._notify()

    async def _settle_receipts(self, ticket: RunTicket) -> None:
        receipts = await self.repo.receipts(ticket.id)
        if not any(r.state is SteerState.QUEUED for r in receipts):
            return
        pending: str | None = None
        lane = self.lanes.get(ticket.lane)
        if lane is not None and ticket.external_id:
            try:
                snapshot = await lane.snapshot(ticket)
                pending = snapshot.pending_notes if snapshot is not None else None
            except LaneError:
                pending = None
        now = self._clock()
        await self.repo.update_receipts(ticket.id, lambda r: receipt_on_finish(r, ticket.state, pending, now))
        await self._notify()

    async def _stop_on_lane(self, run_id: int) -> None:
        ticket = await self.repo.get(run_id)
        if ticket is None or not ticket.active:
            return
        try:
            await self.lanes[ticket.lane].stop(ticket)
        except LaneError as exc:
            await self._log(run_id, "stop", f"the lane did not stop it: {exc}")

    # -- approvals ---------------------------------------------------------------------------------

    def _ask(self, ticket: RunTicket, effect: AskApproval) -> None:
        text = wording.approval_question(ticket, self.config.approval_timeout_s)
        self._spawn(self._announce_all(text), f"ask-{ticket.id}")
        delay = max(0.0, effect.approval.deadline - self._clock())
        previous = self._approval_timers.pop(ticket.id, None)
        if previous is not None:
            previous.cancel()
        self._approval_timers[ticket.id] = self._spawn(
            self._approval_timer(ticket.id, effect.approval.request_id, delay), f"approval-{ticket.id}")

    async def _approval_timer(self, run_id: int, request_id: str | None, delay: float) -> None:
        await self._sleep(delay)
        ticket = await self.repo.get(run_id)
        if (ticket is None or ticket.state is not RunState.WAITING_FOR_APPROVAL or ticket.approval is None
                or ticket.approval.request_id != request_id):
            return
        # Decided: from here no observation may cancel this task. Answering makes the lane report the run
        # running again, and that report (on the stream's task) would otherwise cancel this timer before
        # it says the question was denied (seen on PostgreSQL, whose slower write lost the race).
        if self._approval_timers.get(run_id) is asyncio.current_task():
            del self._approval_timers[run_id]
        await self.repo.log(run_id, "approval", "no answer in time: denied", self._clock())
        try:
            await self.lanes[ticket.lane].answer(ticket, request_id, "deny")
        except LaneError as exc:
            await self._log(run_id, "approval", f"the automatic deny failed: {exc}")
            return
        await self._observe(run_id, ApprovalAnswered("deny"))
        await self._announce_all(f"Run {run_id}'s question got no answer within "
                                 f"{wording.elapsed_words(self.config.approval_timeout_s)}, so I denied it.")

    async def resolve_approval(self, run_id: Any, choice: str,
                               requester_id: int | None = None) -> Answered | Refused:
        """Answer the run's pending question with once, session or deny; raises UnknownRun."""
        choice = str(choice or "").strip().lower()
        if choice not in VOICE_APPROVAL_CHOICES:
            return Refused(f"answer once, session or deny ({choice!r} is not accepted by voice; 'always' never is)")
        ticket = await self._get(run_id)
        if ticket.state is not RunState.WAITING_FOR_APPROVAL or ticket.approval is None:
            return Refused(f"run {ticket.id} is not waiting for an answer (it is {wording.STATE_WORDS[ticket.state]})")
        allowed = wording.voice_choices(ticket.approval.choices)
        if choice not in allowed:
            return Refused(f"run {ticket.id}'s question allows only {', '.join(allowed)}")
        try:
            await self.lanes[ticket.lane].answer(ticket, ticket.approval.request_id, choice)
        except LaneError as exc:
            return Refused(self._scrub_for(ticket.id)(f"could not answer run {ticket.id}: {exc}"))
        await self.repo.log(ticket.id, "approval", f"answered {choice} by {requester_id or 'unknown'}", self._clock())
        await self._observe(ticket.id, ApprovalAnswered(choice))
        return Answered(ticket.id, choice, f"told run {ticket.id}: {wording.CHOICE_WORDS[choice]}")

    # -- steer and stop ----------------------------------------------------------------------------

    async def steer(self, run_id: Any, note: str, requester_id: int | None = None) -> NoteQueued | Refused:
        """Queue a note for a running agent; the receipt stays queued until the lane shows it read.
        Raises UnknownRun."""
        note = (note or "").strip()
        if not note:
            return Refused("say what the note to the agent should be")
        ticket = await self._get(run_id)
        note = self._scrub_for(ticket.id)(note)  # stored with the run and read back to the call
        if ticket.terminal:
            return Refused(f"run {ticket.id} already {wording.STATE_WORDS[ticket.state]}; a note cannot reach it")
        lane = self.lanes.get(ticket.lane)
        if lane is None:
            return Refused(f"run {ticket.id}'s lane {ticket.lane} is not configured here")
        if isinstance(lane, CommandLane):
            return Refused(f"run {ticket.id} is a one-shot command, which has no way to pass a note to a "
                           f"running agent; I can stop it instead (stop_work)", can_stop=True)
        if not ticket.external_id:
            return Refused(f"{lane.name} has not accepted run {ticket.id} yet; try the note again in a moment")
        token = f"sb-{secrets.token_hex(4)}"
        probe = SteerReceipt(0, ticket.id, token, note, SteerState.QUEUED, 0.0, 0.0)
        try:
            await lane.steer(ticket, probe.wire_text)
        except LaneError as exc:
            return Refused(self._scrub_for(ticket.id)(f"run {ticket.id} did not take the note: {exc}"),
                           can_stop=True)
        receipt = await self.repo.add_receipt(ticket.id, token, note, self._clock())
        await self._notify()
        log.info("run %s: note %s queued by %s", ticket.id, token, requester_id or "unknown")
        await self._check_notes(ticket)
        return NoteQueued(receipt, f"note queued for run {ticket.id}: accepted, not yet shown to be read; "
                                   f"check_work will say whether it landed")

    async def stop(self, run_id: Any, reason: str | None = None,
                   requester_id: int | None = None) -> Stopped | Refused:
        """Record the stop, then tell the lane (or leave it to when the lane accepts the run); a run
        already finished is answered as such. Raises UnknownRun."""
        ticket = await self._get(run_id)
        if ticket.terminal:
            return Stopped(ticket.id, StopOutcome.ALREADY_ENDED, ticket.state,
                           f"run {ticket.id} already {wording.STATE_WORDS[ticket.state]}")
        reason = (reason or "").strip() or "asked to stop"
        await self._observe(ticket.id, StopRequested(reason[:200], "user", requester_id))  # recorded first
        lane = self.lanes.get(ticket.lane)
        if lane is None:
            return Refused(f"run {ticket.id}'s lane {ticket.lane} is not configured here")
        if not ticket.external_id:
            return Stopped(ticket.id, StopOutcome.ON_ACCEPT, ticket.state,
                           f"run {ticket.id} will be stopped as soon as {lane.name} accepts it")
        try:
            said = await lane.stop(ticket)
        except AlreadyEnded as ended:  # it finished before the stop reached it: that is the answer
            await self._observe(ticket.id, ended.observation)
            after = await self._get(ticket.id)
            return Stopped(after.id, StopOutcome.ALREADY_ENDED, after.state, wording.ended_before_stop(after))
        except LaneError as exc:
            return Refused(self._scrub_for(ticket.id)(f"could not stop run {ticket.id}: {exc}"))
        now = self._clock()
        superseded = await self.repo.update_receipts(ticket.id, lambda r: receipt_on_stop(r, now))
        await self._notify()
        sessions = await self.store.sessions() if elsewhere([ticket.owner]) else None
        if not self._watch and not owner_alive(ticket.owner, me=self.owner, sessions=sessions):
            await self._settle_unwatched(ticket, lane)
        return Stopped(ticket.id, StopOutcome.STOPPING, ticket.state,
                       f"stopping run {ticket.id} ({lane.name} says {said})", superseded=len(superseded))

    async def _settle_unwatched(self, ticket: RunTicket, lane: Lane) -> None:
        """CLI stop of a run nobody watches: record what the lane now says, since no watcher will."""
        if isinstance(lane, CommandLane):
            await lane.wait_stopped()
            await self._observe(ticket.id, Finished(RunState.CANCELLED, interrupted=True), effects=False)
            return
        try:
            snapshot = await lane.snapshot(ticket)
        except LaneError:
            return
        if snapshot is not None and snapshot.terminal and snapshot.observation is not None:
            await self._observe(ticket.id, snapshot.observation, effects=False)

    # -- reading -----------------------------------------------------------------------------------

    async def _get(self, run_id: Any) -> RunTicket:
        try:
            number = int(str(run_id).strip().lstrip("#"))
        except (TypeError, ValueError):
            raise UnknownRun(run_id) from None
        if not 1 <= number <= 2**63 - 1:  # a model's or a user's huge number is no run, not an OverflowError
            raise UnknownRun(run_id)
        ticket = await self.repo.get(number)
        if ticket is None:
            raise UnknownRun(number)
        return ticket

    async def get(self, run_id: Any) -> RunTicket:
        """The ticket for a run number; raises UnknownRun."""
        return await self._get(run_id)

    def _can_steer(self, ticket: RunTicket) -> bool:
        lane = self.lanes.get(ticket.lane)
        return bool(lane is not None and ticket.external_id and lane.can_steer())

    async def check(self, run_id: Any = None) -> RunStatus | RunsOverview:
        """One run in detail with its notes (finished output bounded), or — without a number — what is
        going and what landed recently. Raises UnknownRun."""
        now = self._clock()
        if run_id not in (None, ""):
            ticket = await self._get(run_id)
            receipts = await self.repo.receipts(ticket.id)
            return RunStatus(ticket, now, self._can_steer(ticket), tuple(receipts), output_chars=CHECK_OUTPUT_CHARS)
        recent = await self.repo.recent(50)
        active = [t for t in recent if t.active]
        finished = [t for t in recent if t.terminal][:RECENT_FINISHED]
        return RunsOverview(tuple(RunStatus(t, now, self._can_steer(t)) for t in active),
                            tuple(RunStatus(t, now, self._can_steer(t)) for t in finished))

    async def list_agents(self) -> RunningAgents:
        """What is running, and for each whether it can be steered or only stopped."""
        now = self._clock()
        active = await self.repo.active()
        if any(t.lane == HermesApiLane.name for t in active):
            lane = self.lanes.get(HermesApiLane.name)
            if lane is not None and not lane.can_steer():
                await lane.probe()  # learn the features after a restart
        return RunningAgents(tuple(RunStatus(t, now, self._can_steer(t)) for t in active))

    async def tickets(self, limit: int = 50) -> list[RunTicket]:
        return await self.repo.recent(limit)

    async def tickets_of(self, origin: str) -> list[RunTicket]:
        """The runs `delegate` recorded with this `origin` (a call's id), oldest first; none for a blank one."""
        origin = (origin or "").strip()
        return await self.repo.of_origin(origin) if origin else []

    # -- restart recovery --------------------------------------------------------------------------

    async def _reconcile(self, ticket: RunTicket) -> None:
        """Adopt a run whose watcher died, ask its lane what it is now, and keep watching if it runs."""
        previous = ticket.owner
        adopted = await self.repo.update(ticket.id, lambda t: replace(t, owner=self.owner) if t.owner == previous
                                         else None)
        if adopted is None or adopted[1].owner != self.owner:
            return  # another instance adopted it first
        ticket = adopted[1]
        await self.repo.log(ticket.id, "reconcile", f"adopted from a watcher that is gone ({previous.split(':')[0]})",
                            self._clock())
        lane = self.lanes.get(ticket.lane)
        if lane is None:
            observations: list[Observation] = [Finished(RunState.LOST, error=f"its lane {ticket.lane} is not "
                                                                             f"configured any more")]
        else:
            observations = await lane.reconcile(ticket)
        for obs in observations:
            await self._observe(ticket.id, obs)
        after = await self.repo.get(ticket.id)
        if after is not None and after.active and lane is not None and after.external_id:
            self._spawn(self._follow(ticket.id), f"run-{ticket.id}")

    # -- delivery ----------------------------------------------------------------------------------

    def release_delivery(self) -> None:
        """Deliver what was held (see `hold_delivery_s`), and from now on at once."""
        self._deliverable.set()

    async def _deliver(self, run_id: int) -> None:
        """Claim (exactly one deliverer wins), announce in every live call, post, mark delivered."""
        if not self._deliverable.is_set():
            self.held += 1
            await self._notify()
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._deliverable.wait(), self._hold_delivery_s)
            finally:
                self.held -= 1
        if not await self.repo.claim(run_id, self.owner):
            return
        ticket = await self.repo.get(run_id)
        assert ticket is not None
        announced = await self._announce_all(wording.announcement(ticket, self.config.spoken_chars))
        try:
            await self._sink.post_run(ticket)
        except Exception:
            log.exception("run %s: posting the finished run failed", run_id)
        await self.repo.mark_delivered(run_id, self.owner, announced=announced, now=self._clock())
        await self._notify()

    async def _announce_all(self, text: str) -> bool:
        calls = list(self._announcers)
        if not calls:
            return False
        results = await asyncio.gather(*(call.announce(text) for call in calls), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                log.warning("an announcement failed: %s", type(result).__name__)
        return any(result is True for result in results)

    # -- tasks -------------------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        return self._tasks.spawn(coro, name)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_held(self, count: int) -> None:
        """Until `count` finished runs wait for `release_delivery`."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.held >= count)

    async def wait_until(self, run_id: int, predicate: Callable[[RunTicket], bool]) -> RunTicket:
        """Wait (without polling) until this instance records a change that makes `predicate` true."""
        async with self._changed:
            while True:
                ticket = await self.repo.get(run_id)
                if ticket is not None and predicate(ticket):
                    return ticket
                await self._changed.wait()

    async def wait_receipts(self, run_id: int, predicate: Callable[[list[SteerReceipt]], bool]) -> list[SteerReceipt]:
        async with self._changed:
            while True:
                receipts = await self.repo.receipts(run_id)
                if predicate(receipts):
                    return receipts
                await self._changed.wait()
