"""The `switchboard` command line.

Every command reads and validates the settings the same way (`bot.environment`, `bot.settings`);
a malformed setting stops every command but `doctor`, which lists it with everything else.

Exit codes: 0 done, 1 a failure (provider, network; doctor: a check failed), 2 usage, configuration
or a store that cannot be opened or is damaged (callbacks: a refused change), 3 `talk --timeout` or a `callbacks` change without a
run's token, 130 interrupted (Ctrl-C; 143 for SIGTERM), 141 the output pipe closed (`| head`).
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from bot.cli.args import EXIT_USAGE, positive_seconds
from voice import __version__

if TYPE_CHECKING:
    from bot.settings import SettingsReport

# Everything heavy (pydantic, numpy, discord.py) is imported inside `main`, so a Ctrl-C while it
# loads is exit 130 like any other, not a traceback.

EXIT_PIPE = 128 + 13  # SIGPIPE: what a shell shows for a writer whose reader closed
class OneLineParser(argparse.ArgumentParser):
    """A usage mistake is one line that says what was wrong and where help is (exit 2), not the
    usage block, which can run to several lines before the line that matters."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from bot.cli import callbacks as callbacks_cli
    from bot.cli import runs as runs_cli
    from bot.cli import store as store_cli
    from bot.cli import transcripts as transcripts_cli

    parser = OneLineParser(
        prog="switchboard",
        description="Switchboard: a Discord voice presence for your agent.",
        epilog="Exit codes: 0 done, 1 a failure (provider, network; doctor: a check failed), 2 usage, "
               "configuration or a store that cannot be opened or is damaged (callbacks: a refused change), 3 talk --timeout, or a callbacks change without a "
               "run's token, 130 interrupted (143 SIGTERM), 141 the output pipe closed (e.g. `| head`).",
    )
    parser.add_argument("--version", action="version", version=f"switchboard {__version__}")
    parser.add_argument("--env-file", type=Path, default=None, metavar="FILE",
                        help="dotenv file to load; it must exist (default: ./.env when it exists)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("doctor", help="read-only diagnostics: Python, libopus, davey, audio, settings, the key",
                   description="Read-only diagnostics, one row per check: ok, warn (an optional feature is "
                               "unavailable) or BAD, every row that can fail saying what to do. Every problem is "
                               "listed at once; setting values are never shown. Exit 0, or 1 when a row is BAD.")
    sub.add_parser("run", help="the Discord bot with background runs (needs DISCORD_BOT_TOKEN and a provider key)",
                   description="The Discord bot, the background runs service and, when "
                               "TRANSCRIPT_LISTENER_API_KEY is set, the Smartnumbers listener, in one process. "
                               "Needs DISCORD_BOT_TOKEN and a provider key (see docs/discord.md). While Discord "
                               "cannot be reached it says so and retries (1 s doubling to 60 s). Exit codes: 0 "
                               "stopped (Ctrl-C or SIGTERM leave every call and shut down in order); 1 Discord "
                               "refused the gateway intents or a request, or the client failed; 2 a setting is "
                               "missing or malformed, Discord rejected the token, or the store cannot be opened "
                               "or is damaged; 130 Ctrl-C before start-up finished.")
    sub.add_parser("listen", help="the Smartnumbers listener alone: archive calls, run their named commands",
                   description="The Smartnumbers listener without Discord: receive phone-call transcripts, "
                               "archive them, learn durable facts, and run the review, callbacks and named "
                               "commands as background runs; results go to the archive and the terminal. Needs "
                               "TRANSCRIPT_LISTENER_API_KEY (see docs/listener.md). Ctrl-C or SIGTERM stop it: "
                               "exit 0; 2 for a configuration problem.")
    sub.add_parser("start", help="`run` when DISCORD_BOT_TOKEN is set, otherwise the terminal conversation (`talk`)",
                   description="What `make run` calls: the Discord bot (`switchboard run`) when "
                               "DISCORD_BOT_TOKEN is set, otherwise the conversation on this terminal's "
                               "microphone and speaker (`switchboard talk`); it says which it chose and why.")
    talk = sub.add_parser("talk", help="talk with the assistant: microphone and speaker, or WAV in / WAV out",
                          description="A conversation with the assistant on this terminal's microphone and "
                                      "speaker (Ctrl-C ends it: exit 0), or from IN.wav into OUT.wav (Ctrl-C: "
                                      "exit 130). Needs a provider key. Everything that can be wrong is checked "
                                      "before the call starts: one line, exit 2.")
    talk.add_argument("--input-wav", type=Path, help="feed this WAV as if spoken (any rate/channels)")
    talk.add_argument("--output-wav", type=Path, help="write what the assistant says here (24 kHz mono)")
    talk.add_argument("--metrics-json", type=Path, help="append per-turn latency records here (JSON lines)")
    talk.add_argument("--timeout", type=positive_seconds, default=None, metavar="SECONDS",
                      help="give up after this many seconds (exit 3); default: no limit")
    talk.add_argument("--endpointing", choices=("server", "local"), help="override SWITCHBOARD_ENDPOINTING")
    talk.add_argument("--no-echo-gate", action="store_true", help="terminal: do not suppress speaker echo")
    runs_cli.add_parser(sub)
    transcripts_cli.add_parser(sub)
    callbacks_cli.add_parser(sub)
    store_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run one command; `environ` stands in for the process environment (tests)."""
    try:
        try:
            return _main(argv, environ)
        finally:
            sys.stdout.flush()  # output cut off by a closed pipe shows here, not as an error at exit
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe (a socket, a child): a real failure
        # `switchboard … | head`: the reader has what it wanted. End quietly, as SIGPIPE would end a
        # C program (Python ignores SIGPIPE, so the write raised instead); what is still buffered goes nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    except Exception as exc:  # the store found damaged or locked after the command opened it: one line, exit 2
        from common.store import StoreError

        if not isinstance(exc, StoreError):
            raise
        print(f"switchboard: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _stdout_closed() -> bool:
    """Whether stdout is a pipe or socket whose reader has gone (poll reports an error on it)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll, or stdout is not a file (a test's capture)
        return False


def _main(argv: list[str] | None, environ: Mapping[str, str] | None) -> int:
    from bot.environment import EnvFileError, read_variables
    from bot.settings import check_settings

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # a usage mistake like any other: the help says what to type, exit 2
        parser.print_help(sys.stderr)
        print("switchboard: name a command, e.g. `switchboard doctor` (see above)", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(args.verbose)
    try:
        variables = read_variables(args.env_file, environ)
    except EnvFileError as exc:
        print(f"switchboard: {exc}", file=sys.stderr)
        return EXIT_USAGE
    report = check_settings(variables)
    if args.command == "doctor":
        from bot.cli import doctor

        checks = doctor.run_checks(report, _env_source(args.env_file))
        print(doctor.render(checks))
        return doctor.exit_code(checks)
    if not _settings_usable(report, args.command):
        return EXIT_USAGE
    if args.command == "start":
        token = report.settings.discord_token
        if token is not None and token.get_secret_value():
            print("switchboard start: DISCORD_BOT_TOKEN is set, so starting the Discord bot (switchboard run)",
                  file=sys.stderr)
            args.command = "run"
        else:
            print("switchboard start: no DISCORD_BOT_TOKEN, so starting the terminal conversation (switchboard "
                  "talk); set it to run the Discord bot (README: 'Add the bot to your server')", file=sys.stderr)
            args = parser.parse_args([*(["--env-file", str(args.env_file)] if args.env_file else []), "talk"])
    if args.command == "talk":
        from bot.cli import talk

        return talk.run(report.settings, args)
    if args.command == "run":
        from bot.cli.run import run as run_service
        from bot.phone.listener import rotating_key

        return run_service(report.settings, listener_key=rotating_key(args.env_file, environ))
    if args.command == "runs":
        from bot.cli import runs as runs_cli

        return runs_cli.run(args, report.settings)
    if args.command == "listen":
        from bot.cli import listen
        from bot.phone.listener import rotating_key

        return listen.run(report.settings, key=rotating_key(args.env_file, environ))
    if args.command == "transcripts":
        from bot.cli import transcripts as transcripts_cli

        return transcripts_cli.run(args, report.settings)
    if args.command == "callbacks":
        from bot.cli import callbacks as callbacks_cli

        return callbacks_cli.run(args, report.settings)
    if args.command == "store":
        from bot.cli import store as store_cli

        return store_cli.run(args, report.settings)
    raise AssertionError(f"unhandled command {args.command!r}")  # pragma: no cover


def configure_logging(verbose: bool) -> None:
    """Log lines to stderr, each passed through the credential redactor: whatever a library logs (a
    database URL with its password, a header) reaches no handler with a credential in it."""
    from common.redact import CredentialRedactor

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request's full URL at INFO (a presigned transcript URL's signature) and httpcore
    # every header at DEBUG (the Hermes key): neither may reach a log, even with -v.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.addFilter(CredentialRedactor())


def _settings_usable(report: SettingsReport, command: str) -> bool:
    """Print what doctor would print about the settings; False when the command must stop."""
    for line in report.problems:
        print(f"switchboard {command}: {line}", file=sys.stderr)
    for line in report.notices + report.ignored:
        print(f"switchboard {command}: warning: {line}", file=sys.stderr)
    return not report.problems


def _env_source(env_file: Path | None) -> str:
    from bot.environment import DEFAULT_ENV_FILE

    path = env_file if env_file is not None else DEFAULT_ENV_FILE
    if env_file is None and not path.exists():
        return f"{path} absent; the environment only (see .env.example)"
    return f"{path} (the environment wins over it)"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
