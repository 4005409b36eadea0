"""The `switchboard` command line."""

from __future__ import annotations

import argparse
import logging
import sys

from dotenv import load_dotenv

from voice import __version__

from . import doctor, talk
from .settings import Settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchboard",
        description="Switchboard: a Discord voice presence for your agent.",
    )
    parser.add_argument("--version", action="version", version=f"switchboard {__version__}")
    parser.add_argument("--env-file", default=".env", help="dotenv file to load (default: .env)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("doctor", help="read-only diagnostics: Python, libopus, davey, which settings are set")
    talk.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    load_dotenv(args.env_file, override=False)
    settings = Settings.from_env()
    if args.command == "doctor":
        checks = doctor.run_checks(settings)
        print(doctor.render(checks))
        return 0 if all(c.ok for c in checks) else 1
    if args.command == "talk":
        return talk.run(settings, args)
    parser.print_help()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
