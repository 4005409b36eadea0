"""`switchboard callbacks …`: what runs after each phone call — the review and the callbacks.

Reading (`list`, `review show`) is open. A change here needs a named-command run's short-lived
token (`--token`, or SWITCHBOARD_CALLBACK_TOKEN): this is the door a background agent uses when you
asked it, during a call, to change what runs after calls. There is no "at a terminal" exception —
any process can fake a terminal. People change callbacks in Discord (`/callbacks`, operators), by
voice (`transcript_review_config`: in `switchboard talk`, or in a Discord call as an operator), or
by asking during a phone call ("Ares, add a callback that …").
Exit codes: 0 ok, 2 usage, the store (cannot be opened, damaged) or a refused change (nothing saved), 3 no token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, TextIO

from bot.services import build_services
from bot.settings import Settings
from bot.tools.phone import review_config
from common.paths import home_problem
from common.store import StoreError
from listener.callbacks import CallbackError

TOKEN_VARIABLE = "SWITCHBOARD_CALLBACK_TOKEN"
EXIT_NO_AUTHORITY = 3  # no valid token


NEEDS_TOKEN = (f"Changing needs the token a named-command run is given (--token or {TOKEN_VARIABLE}); without it: "
               "exit 3 and nothing changes. People change callbacks in Discord (/callbacks), by voice, or during "
               "a phone call.")
EXIT_CODES = ("Exit codes: 0 ok, 2 usage, the store (cannot be opened, damaged) or a refused change (nothing saved), "
              "3 no valid token.")


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("callbacks", help="what runs after each phone call: the review and callbacks",
                                   description="What runs after each phone call: the review and the callbacks. "
                                               f"Reading (list, review show) is open. {NEEDS_TOKEN}",
                                   epilog=EXIT_CODES)
    actions = parser.add_subparsers(dest="callbacks_command", metavar="ACTION", required=True)

    def change(name: str, help: str) -> argparse.ArgumentParser:
        return actions.add_parser(name, help=f"{help} (needs a run's token)",
                                  description=f"{help[0].upper()}{help[1:]}. {NEEDS_TOKEN}", epilog=EXIT_CODES)

    listing = actions.add_parser("list", help="every callback and the review", epilog=EXIT_CODES)
    review = actions.add_parser("review", help="the call review: show; set or clear its instructions (needs a "
                                               "run's token)",
                                description=f"The call review: show it (open), set or clear its instructions. "
                                            f"{NEEDS_TOKEN}", epilog=EXIT_CODES)
    reviews = review.add_subparsers(dest="review_action", metavar="ACTION", required=True)
    review_show = reviews.add_parser("show", help="its instructions and where its results go (open)",
                                     description="The call review's instructions and where its results go.",
                                     epilog=EXIT_CODES)
    review_set = reviews.add_parser("set", help="set its instructions (needs a run's token)",
                                    description=f"Set the call review's instructions. {NEEDS_TOKEN}", epilog=EXIT_CODES)
    review_set.add_argument("instructions", nargs="?", help="what the agent does after each call")
    review_clear = reviews.add_parser("clear", help="clear its instructions (needs a run's token)",
                                      description=f"Clear the call review's instructions. {NEEDS_TOKEN}",
                                      epilog=EXIT_CODES)
    register = change("register", "a new callback")
    register.add_argument("id", help="1-40 lowercase letters, digits, - or _")
    register.add_argument("name", help="a short name people see in lists")
    register.add_argument("instructions", help="what the agent does after each call")
    update = change("update", "change a callback")
    update.add_argument("id", help="the callback's id (see `switchboard callbacks list`)")
    update.add_argument("--name", help="a new name")
    update.add_argument("--instructions", help="new instructions")
    changes = [review_set, review_clear, register, update]
    for name in ("enable", "disable", "remove"):
        action = change(name, f"{name} a callback")
        action.add_argument("id", help="the callback's id (see `switchboard callbacks list`)")
        changes.append(action)
    for action in (review_set, register, update):
        action.add_argument("--deliver", help="local, discord:<channel id>, or default; empty clears (update)")
    for action in changes:
        action.add_argument("--token", help=f"a named-command run's token (or {TOKEN_VARIABLE})")
    for action in (listing, review_show, *changes):
        action.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(main(args, settings))


def _request(args: argparse.Namespace) -> dict[str, Any]:
    command = args.callbacks_command
    if command == "list":
        return {"action": "list"}
    if command == "review":
        return {"action": args.review_action, "instructions": getattr(args, "instructions", None),
                "deliver": getattr(args, "deliver", None)}
    return {"action": command, "id": args.id, "name": getattr(args, "name", None),
            "instructions": getattr(args, "instructions", None), "deliver": getattr(args, "deliver", None)}


async def main(args: argparse.Namespace, settings: Settings, *, out: TextIO | None = None, err: TextIO | None = None,
               environ: dict[str, str] | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    request = _request(args)
    changing = request["action"] not in ("list", "show")
    if problem := home_problem(settings.home, writing=changing):
        print(f"switchboard callbacks: {problem}", file=err)
        return 2
    try:
        async with build_services(settings, watch_runs=False, create_store=changing,
                                  read_only=not changing) as services:
            if changing:
                env = os.environ if environ is None else environ
                token = getattr(args, "token", None) or env.get(TOKEN_VARIABLE)
                if not await services.tokens.valid(token):
                    print("switchboard callbacks: refused: "
                          + ("that token is not valid or has expired" if token else "changing callbacks here needs "
                             "the token a named-command run is given")
                          + "; change them in Discord (/callbacks), by voice (switchboard talk: \"set my call review "
                          "to …\"), or during a phone call (\"Ares, add a callback that …\")", file=err)
                    return EXIT_NO_AUTHORITY
            result = await review_config(services.callbacks, request)
    except (StoreError, CallbackError) as exc:
        print(f"switchboard callbacks: {exc}", file=err)
        return 2
    if getattr(args, "json", False):
        json.dump(result, out, indent=2)
        out.write("\n")
    else:
        _print(result, out)
    return 0


def _print(result: dict[str, Any], out: TextIO) -> None:
    if "callbacks" in result:
        if not result["callbacks"]:
            print("no callbacks and no review instructions", file=out)
        for c in result["callbacks"]:
            state = "on " if c["enabled"] else "off"
            print(f"{state} {c['id']:<20} r{c['revision']:<3} → {c['deliver']:<28} {c['name']}: "
                  f"{' '.join(c['instructions'].split())[:120]}", file=out)
        return
    if "review" in result and result["review"] is not None:
        review = result["review"]
        print(f"review (revision {review['revision']}, → {review['deliver']}): {review['instructions']}", file=out)
    if "summary" in result:
        print(result["summary"], file=out)
