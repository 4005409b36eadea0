"""`switchboard runs list|show N|stop N`: the run tickets in the store, without a call.

The CLI never reconciles, follows or delivers runs (the running service does); it reads tickets and
asks a lane to stop one. Exit codes: 0 ok, 1 the lane failed, 2 usage, configuration or the store
(unknown run, unusable SWITCHBOARD_HOME).

A run's task, output, error, progress, notes and events are the agent's or a caller's words: printed
without control or format characters (`common.visible`: no ESC sequence repaints the terminal, sets a
hyperlink or writes the clipboard), each one-line field on one line. `--json` escapes them itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TextIO

from bot.cli.args import MAX_ROW, whole_number
from bot.services import build_services
from bot.settings import Settings
from common.paths import home_problem
from common.store import StoreError
from common.visible import plain_line, printable
from runs.config import RunsConfig
from runs.core import RunTicket, SteerReceipt
from runs.lanes import Lane
from runs.procs import owner_alive
from runs.repository import RunEvent
from runs.results import Refused
from runs.service import RunService, UnknownRun
from runs.wording import STATE_WORDS, bounded, elapsed_words

MAX_LIST = 1000


def add_parser(subparsers: Any) -> None:
    runs = subparsers.add_parser("runs", help="background runs: list, show or stop them (no call needed)",
                                 description="The background runs in SWITCHBOARD_HOME's store, without a call: "
                                             "list them, show one, or stop one on its lane. Exit codes: 0 ok, 1 the "
                                             "lane failed, 2 usage, configuration (an unknown run) or the store.")
    actions = runs.add_subparsers(dest="runs_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="recent runs, newest first")
    listing.add_argument("--limit", type=whole_number(1, MAX_LIST), default=20,
                         help=f"how many (1-{MAX_LIST}, default 20)")
    show = actions.add_parser("show", help="one run: state, output, notes, events")
    show.add_argument("run", type=run_reference, help="the run number (12 or #12)")
    stop = actions.add_parser("stop", help="stop a run on its lane")
    stop.add_argument("run", type=run_reference, help="the run number (12 or #12)")
    stop.add_argument("--reason", default="stopped from the command line", help="recorded with the stop")
    for parser in (listing, show, stop):
        parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Synchronous entry point for `bot.cli.main`."""
    return asyncio.run(main(args, settings))


async def main(args: argparse.Namespace, settings: Settings, *, config: RunsConfig | None = None,
               out: TextIO | None = None, err: TextIO | None = None, lanes: Sequence[Lane] | None = None,
               clock: Callable[[], float] = time.time,
               sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> int:
    """`config` replaces the runs configuration read from `settings` (tests)."""
    out = out or sys.stdout
    err = err or sys.stderr
    reading = args.runs_command != "stop"
    if problem := home_problem(settings.home, writing=not reading):  # configuration: the line doctor prints
        print(f"switchboard runs: {problem}", file=err)
        return 2
    try:
        async with build_services(settings, watch_runs=False, config=config, lanes=lanes, clock=clock,
                                  sleep=sleep, create_store=False, read_only=reading) as services:
            return await _act(services.runs, args, out, err, clock)
    except StoreError as exc:
        print(f"switchboard runs: {exc}", file=err)
        return 2


async def _act(service: RunService, args: argparse.Namespace, out: TextIO, err: TextIO,
               clock: Callable[[], float]) -> int:
    try:
        if args.runs_command == "list":
            return await _list(service, args, out, clock())
        if args.runs_command == "show":
            return await _show(service, args, out, clock())
        if args.runs_command == "stop":
            return await _stop(service, args, out, err)
        print(f"switchboard runs: unknown action {args.runs_command!r}", file=err)
        return 2
    except UnknownRun as exc:
        print(f"switchboard runs: {exc} (`switchboard runs list` shows the numbers)", file=err)
        return 2


def _watched(ticket: RunTicket, service: RunService) -> bool | None:
    return owner_alive(ticket.owner, me=service.owner) if ticket.active else None


def ticket_json(ticket: RunTicket, now: float, *, watched: bool | None) -> dict[str, Any]:
    return {
        "run": ticket.id, "lane": ticket.lane, "state": ticket.state.value, "task": ticket.task,
        "requester_id": ticket.requester_id, "external_id": ticket.external_id,
        "created_at": ticket.created_at, "started_at": ticket.started_at, "finished_at": ticket.finished_at,
        "elapsed_s": round(ticket.elapsed(now), 3), "progress": ticket.progress, "output": ticket.output,
        "output_cut": ticket.output_cut, "error": ticket.error,
        "approval": None if ticket.approval is None else {
            "request_id": ticket.approval.request_id, "choices": list(ticket.approval.choices),
            "description": ticket.approval.description, "deadline": ticket.approval.deadline},
        "stop": None if ticket.stop is None else {"reason": ticket.stop.reason, "kind": ticket.stop.kind,
                                                  "at": ticket.stop.at, "by": ticket.stop.by},
        "delivery": ticket.delivery.value, "announced": ticket.announced, "watched": watched, "origin": ticket.origin,
    }


async def _list(service: RunService, args: argparse.Namespace, out: TextIO, now: float) -> int:
    tickets = await service.tickets(args.limit)
    if args.json:
        json.dump([ticket_json(t, now, watched=_watched(t, service)) for t in tickets], out, indent=2)
        out.write("\n")
        return 0
    if not tickets:
        print("no runs yet", file=out)
        return 0
    print(f"{'RUN':>4}  {'STATE':<21} {'LANE':<11} {'TIME':<16} TASK", file=out)
    for t in tickets:
        flag = " (not watched)" if _watched(t, service) is False else ""
        print(f"{t.id:>4}  {t.state.value:<21} {t.lane:<11} {elapsed_words(t.elapsed(now)):<16} "
              f"{bounded(plain_line(t.task), 60)}{flag}", file=out)
    return 0


def run_reference(text: str) -> str:
    """argparse type: text that reads as a run number (`12`, `#12`), so `runs show abc` is a usage mistake
    that says so, not "there is no run abc". Whether that run exists is `run_number`'s and the store's."""
    if not re.fullmatch(r"\s*#?[0-9]+\s*", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a run number (e.g. 12 or #12; `switchboard runs list` "
                                         "shows them)")
    return text


def run_number(text: str) -> int:
    """A run number as typed (`12`, `#12`); UnknownRun for anything that cannot be one (`nine`, 0, 10**30)."""
    try:
        number = int(text.strip().lstrip("#"))
    except ValueError:
        raise UnknownRun(text) from None
    if not 1 <= number <= MAX_ROW:
        raise UnknownRun(text)
    return number


async def _show(service: RunService, args: argparse.Namespace, out: TextIO, now: float) -> int:
    ticket = await service.get(run_number(args.run))
    receipts = await service.repo.receipts(ticket.id)
    events = await service.repo.events(ticket.id)
    watched = _watched(ticket, service)
    if args.json:
        data = ticket_json(ticket, now, watched=watched)
        data["notes"] = [_receipt_json(r) for r in receipts]
        data["events"] = [{"at": e.at, "kind": e.kind, "detail": e.detail} for e in events]
        json.dump(data, out, indent=2)
        out.write("\n")
        return 0
    _print_show(ticket, receipts, events, watched, out, now)
    return 0


def _receipt_json(receipt: SteerReceipt) -> dict[str, Any]:
    return {"note": receipt.note, "state": receipt.state.value, "token": receipt.token,
            "created_at": receipt.created_at, "updated_at": receipt.updated_at}


def _print_show(ticket: RunTicket, receipts: list[SteerReceipt], events: list[RunEvent], watched: bool | None,
                out: TextIO, now: float) -> None:
    print(f"run {ticket.id}: {STATE_WORDS[ticket.state]} on {ticket.lane}, {elapsed_words(ticket.elapsed(now))}",
          file=out)
    if watched is False:
        print("  not watched: the Switchboard that started it has exited; it is reconciled (asked, or "
              "reported lost) when Switchboard next starts", file=out)
    print(f"  task: {plain_line(ticket.task)}", file=out)
    if ticket.requester_id is not None:
        print(f"  asked by: {ticket.requester_id}", file=out)
    if ticket.origin:
        print(f"  started in: voice call {plain_line(ticket.origin)}", file=out)
    if ticket.external_id:
        print(f"  lane id: {plain_line(ticket.external_id)}", file=out)
    if ticket.progress and ticket.active:
        print(f"  last progress: {plain_line(ticket.progress)}", file=out)
    if ticket.approval is not None:
        choices = plain_line(", ".join(ticket.approval.choices)) or "once/session/deny"
        print(f"  question: {plain_line(ticket.approval.description)} ({choices})", file=out)
    if ticket.error:
        print(f"  error: {plain_line(ticket.error)}", file=out)
    for receipt in receipts:
        print(f"  note [{receipt.state.value}]: {plain_line(receipt.note)}", file=out)
    if ticket.terminal:
        heard = {True: "announced in a call", False: "not announced (no call was live)", None: "not yet"}
        print(f"  delivery: {ticket.delivery.value}, {heard[ticket.announced]}", file=out)
    for event in events:
        print(f"  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(event.at))}  {event.kind}: "
              f"{plain_line(event.detail)}", file=out)
    if ticket.output:
        print("--- output" + (" (cut to the size cap)" if ticket.output_cut else "") + " ---", file=out)
        print(printable(ticket.output), file=out)


async def _stop(service: RunService, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    result = await service.stop(run_number(args.run), args.reason)
    if isinstance(result, Refused):
        print(f"switchboard runs: {result.reason}", file=err)
        return 1
    if args.json:
        json.dump(result.as_tool_output(), out, indent=2)
        out.write("\n")
    else:
        print(result.summary, file=out)
    return 0
