"""`switchboard run`, unmodified, pointed at the fake Discord:

    python -m tests.support.fake_discord.run_switchboard

A subprocess because discord.py verifies the fake voice gateway's TLS certificate against the default
trust store, which honours `SSL_CERT_FILE` only if it is set before aiohttp is imported. Environment:
FAKE_DISCORD_API, FAKE_DISCORD_GATEWAY, SSL_CERT_FILE (`FakeDiscord.bot_env()`), and Switchboard's
own settings (DISCORD_BOT_TOKEN, a provider key, …). Exits with `switchboard run`'s exit code.
"""

from __future__ import annotations

import os
import sys

from bot.cli.main import main
from tests.support.fake_discord.pointing import point_discord_py

if __name__ == "__main__":
    with point_discord_py(os.environ["FAKE_DISCORD_API"], os.environ["FAKE_DISCORD_GATEWAY"]):
        sys.exit(main(["--env-file", os.devnull, "run"]))
