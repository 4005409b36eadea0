"""Drive `bot_runner` in a subprocess: send it commands, wait for its events.

    async with BotProcess(fake, workdir) as bot:
        mark = bot.mark()
        await bot.send("join", channel_id=fake.voice_channel.id)
        joined = await bot.wait_event("joined", after=mark)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


class BotProcess:
    def __init__(self, fake: Any, workdir: Path) -> None:
        self.fake, self.workdir = fake, workdir
        self.pcm_dir = workdir / "pcm"
        self.log_path = workdir / "discord.log"
        self.events: list[dict] = []
        self.returncode: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._waiters: list[tuple[Callable[[], Any], asyncio.Future]] = []

    async def __aenter__(self) -> BotProcess:
        self.pcm_dir.mkdir(exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "HOME": str(self.workdir),
               "FAKE_DISCORD_PCM_DIR": str(self.pcm_dir), "FAKE_DISCORD_LOG": str(self.log_path),
               **self.fake.bot_env()}
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.fake_discord.bot_runner", cwd=ROOT, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=open(self.workdir / "stderr.txt", "wb"))  # noqa: SIM115 - the child owns it
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def stop(self, timeout: float = 15.0) -> int:
        """SIGINT (what Ctrl-C does to `Client.run`) and wait for the exit status."""
        if self._proc.returncode is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(self._proc.wait(), timeout)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        await self._reader
        self.returncode = self._proc.returncode
        return self.returncode

    async def _read(self) -> None:
        while line := await self._proc.stdout.readline():
            self.events.append(json.loads(line))
            self._check()

    def _check(self) -> None:
        for predicate, future in list(self._waiters):
            if future.done():
                continue
            try:
                result = predicate()
            except AssertionError as exc:
                future.set_exception(exc)
                continue
            if result:
                future.set_result(result)

    def mark(self) -> int:
        """Index to pass as `after=` so a wait only matches events from now on."""
        return len(self.events)

    async def send(self, cmd: str, **args: Any) -> None:
        self._proc.stdin.write((json.dumps({"cmd": cmd, **args}) + "\n").encode())
        await self._proc.stdin.drain()

    async def wait_event(self, event: str, *, after: int = 0, timeout: float = 15.0,
                         where: Callable[[dict], bool] = lambda e: True) -> dict:
        """The first event named `event` (index >= `after`) matching `where`; fails on join_failed/error."""
        def find() -> dict | None:
            for e in self.events[after:]:
                if e["event"] in ("join_failed", "error") and event not in ("join_failed", "error"):
                    raise AssertionError(f"bot reported {e}; log: {self.log_path}")
                if e["event"] == event and where(e):
                    return e
            return None

        found = find()
        if found:
            return found
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        entry = (find, future)
        self._waiters.append(entry)
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise AssertionError(f"no {event!r} from the bot within {timeout}s; events since mark: "
                                 f"{self.events[after:][-5:]}; log: {self.log_path}") from None
        finally:
            self._waiters.remove(entry)

    def pcm(self, user_id: int) -> bytes:
        path = self.pcm_dir / f"{user_id}.pcm"
        return path.read_bytes() if path.exists() else b""
