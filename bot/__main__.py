"""`python -m bot`: the `switchboard` command. Run by a Python without Switchboard's dependencies (not the
venv's), it says so in one line, exit 2, rather than a traceback from deep inside an import."""

import sys

OURS = {"bot", "voice", "runs", "listener", "common", "tests"}

try:
    from bot.cli.main import main

    code = main()
except ModuleNotFoundError as exc:
    if exc.name is None or exc.name.split(".")[0] in OURS:
        raise  # a module of ours missing is a real bug
    print(f"switchboard: {exc.name} is not installed for {sys.executable}: run `make setup`, then use "
          ".venv/bin/switchboard (or .venv/bin/python -m bot)", file=sys.stderr)
    code = 2
raise SystemExit(code)
