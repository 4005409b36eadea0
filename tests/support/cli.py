"""`switchboard ARGV` run in this process, for tests whose subject is what a command prints and its exit
code rather than the process (signals, SIGPIPE, entry points keep real processes):

    code, out, err = switchboard(["runs", "list"], {"SWITCHBOARD_HOME": str(home)})

`environ` is the command's whole environment, as `env=` is for a subprocess. A usage mistake or
`--help` ends argparse with SystemExit; that is the exit code here, as it would be for the process.
Logging goes to the captured stderr as `logging.basicConfig` in `main` sends it in a real process.
Commands that run their own event loop cannot run inside a test's: await `asyncio.to_thread(switchboard, …)`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Mapping, Sequence

from bot.cli.main import main


def switchboard(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `switchboard ARGV` with `environ`, run by `bot.cli.main.main`."""
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    for handler in handlers:  # so `main`'s basicConfig sets up logging as in a fresh process
        root.removeHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv), environ=dict(environ))
            except SystemExit as exit_:
                code = _exit_status(exit_.code)
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
            handler.close()
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    return code, out.getvalue(), err.getvalue()


def _exit_status(code: object) -> int:
    """The status a process would exit with for `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): printed, status 1
    return 1
