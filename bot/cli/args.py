"""What the commands share: argument types (argparse says what was wrong, exit 2) and how a
long-running command starts (one line per problem and exit 2, or serve until stopped)."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Callable, Coroutine
from typing import Any

EXIT_USAGE = 2

MAX_ROW = 2**63 - 1  # SQLite's largest integer: a run number past it is none


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """argparse type: a whole number from `low` to `high` (argparse says what was wrong, exit 2)."""

    def parse(text: str) -> int:
        try:
            number = int(text.strip())
        except ValueError:
            number = low - 1
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from {low} to {high}")
        return number

    return parse


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds greater than 0."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds (e.g. 60); "
                                         "leave --timeout out for no limit")
    return seconds


def serve_unless(command: str, problems: list[str], serve: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """`switchboard {command}`: each of `problems` as one line and exit 2, or `serve()` until it returns
    its exit code (Ctrl-C before its own signal handlers are in place is `bot.cli.main`'s 130)."""
    for line in problems:
        print(f"switchboard {command}: {line}", file=sys.stderr)
    if problems:
        return EXIT_USAGE
    return asyncio.run(serve())
