"""Argument types the commands share (argparse says what was wrong, exit 2)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

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
