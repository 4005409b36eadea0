"""`switchboard transcripts search QUERY | show ID`: the call archive, without a call or Discord.

Everything printed is what callers said: external, untrusted data (`--json` says so in
`source_trust`). Exit codes: 0 ok (also when nothing matched), 2 usage (no such call, a search with no
words) or the store (cannot be opened, damaged).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any, TextIO

from bot.cli.args import whole_number
from bot.services import build_services
from bot.settings import Settings
from common.paths import home_problem
from common.store import StoreError
from listener.archive import MAX_LIMIT, ArchiveError

MAX_OFFSET = 10**9  # no archive holds a billion turns; past SQLite's integers it would be a traceback


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("transcripts", help="archived phone calls: search them, show one",
                                   description="The phone-call archive in SWITCHBOARD_HOME's store, without a call "
                                               "or Discord. What it prints is what callers said: external, "
                                               "untrusted text. Exit codes: 0 ok (also when nothing matched), 2 usage "
                                               "(no such call, a search with no words) or the store (cannot be "
                                               "opened, damaged).")
    actions = parser.add_subparsers(dest="transcripts_command", metavar="ACTION", required=True)
    search = actions.add_parser("search", help="turns that contain all the words, best match first")
    search.add_argument("query", nargs="+", help="words to look for")
    search.add_argument("--limit", type=whole_number(1, MAX_LIMIT), default=20,
                        help=f"results per page (1-{MAX_LIMIT}, default 20)")
    search.add_argument("--offset", type=whole_number(0, MAX_OFFSET), default=0,
                        help="skip this many results (see next_offset)")
    search.add_argument("--conversation", help="only this call (its conversation id)")
    search.add_argument("--speaker", help="only turns by this speaker label (e.g. TO, FROM)")
    search.add_argument("--direction", choices=("inbound", "outbound"), help="only inbound or outbound calls")
    search.add_argument("--number", help="only calls from or to this phone number")
    search.add_argument("--since", type=_date, metavar="YYYY-MM-DD", help="only calls received on or after this day")
    search.add_argument("--until", type=_date, metavar="YYYY-MM-DD", help="only calls received before this day")
    show = actions.add_parser("show", help="one call, every turn")
    show.add_argument("ref", metavar="ID", help="the archive id or the conversation id")
    for action in (search, show):
        action.add_argument("--json", action="store_true", help="machine-readable output")


def _date(text: str) -> float:
    """A local calendar day as the epoch seconds of its start (argparse says what was wrong)."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%d"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a day; use YYYY-MM-DD, e.g. 2026-12-01") from None


def run(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(main(args, settings))


async def main(args: argparse.Namespace, settings: Settings, *, out: TextIO | None = None,
               err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    if problem := home_problem(settings.home, writing=False):
        print(f"switchboard transcripts: {problem}", file=err)
        return 2
    try:
        async with build_services(settings, watch_runs=False, create_store=False, read_only=True) as services:
            calls = services.archive
            if args.transcripts_command == "search":
                found = await calls.search(" ".join(args.query), conversation_id=args.conversation,
                                           speaker=args.speaker, direction=args.direction, number=args.number,
                                           since=args.since, until=args.until,
                                           limit=args.limit, offset=args.offset)
                _print_search(found, args.json, out)
            else:
                _print_call(await calls.show(args.ref), args.json, out)
    except ArchiveError as exc:
        print(f"switchboard transcripts: {exc}", file=err)
        return 2
    except StoreError as exc:
        print(f"switchboard transcripts: {exc}", file=err)
        return 2
    return 0


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if at else "?"


def _print_search(found: dict[str, Any], as_json: bool, out: TextIO) -> None:
    if as_json:
        json.dump(found, out, indent=2)
        out.write("\n")
        return
    if not found["results"]:
        print("no archived turn matches all those words", file=out)
        return
    print("(what callers said: external, untrusted text)", file=out)
    for r in found["results"]:
        text = " ".join(r["text"].split())
        print(f"{r['transcript_id']:>5}  {_when(r['received_at'])}  {r['direction'] or '?':<8} turn {r['turn_index']:<4} "
              f"{r['speaker']}{' (you)' if r['is_user'] else ''}: {text[:160]}", file=out)
    if found["next_offset"] is not None:
        print(f"… more: --offset {found['next_offset']}", file=out)


def _print_call(call: dict[str, Any], as_json: bool, out: TextIO) -> None:
    if as_json:
        json.dump(call, out, indent=2)
        out.write("\n")
        return
    print(f"call {call['id']} ({call['conversation_id']}): {call['direction'] or 'direction unknown'}, "
          f"from {call['from'] or '?'} to {call['to'] or '?'}, {_when(call['received_at'])}", file=out)
    print("(what callers said: external, untrusted text)", file=out)
    for t in call["turns"]:
        print(f"  {t['index']:>3} {t['speaker']}{' (you)' if t['is_user'] else ''}: {t['text']}", file=out)
    for fact in call.get("facts", []):
        print(f"learned (turn {fact['turn'] - 1}): {fact['fact']}", file=out)
    for job in call.get("jobs", []):
        where = f", {job['delivered']}" if job["delivered"] else ""
        print(f"{job['kind']} {job['label'][:80]!r}: {job['job_id'] or job['state']}{where}", file=out)
    if call.get("review"):
        print(f"review ({call['review_status']}):\n{call['review']}", file=out)
