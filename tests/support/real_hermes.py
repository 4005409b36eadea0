"""The real Hermes Agent api_server (hermes-agent 0.19.0, `make setup` puts it in `.venv-hermes`).

    with FakeAgentModel() as model:
        gateway = RealHermes(model, tmp_path / "hermes").start()   # `hermes gateway run`, its own HERMES_HOME
        lane = HermesApiLane(RunsConfig(hermes_url=gateway.url, hermes_key=REAL_KEY))
        ...
        gateway.kill(signal.SIGTERM); gateway.start()              # a restart, on the same port
        gateway.stop()

Its throwaway HERMES_HOME holds a `.env` that enables the api_server on a free loopback port with a key
(at least 16 characters, or it refuses to start) and a `config.yaml` whose model is `model` (a
`FakeAgentModel`), approvals manual, and the `terminal` tool on, so `[approve:CMD]` tasks ask.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.support.fake_agent_model import MODEL, FakeAgentModel
from tests.support.paths import ROOT
from tests.support.runs import free_port

HERMES_VERSION = "0.19.0"
HERMES_BIN = ROOT / ".venv-hermes" / "bin" / "hermes"
REAL_KEY = "sk-hermes-real-test-key-0123456789"  # the real server refuses a key under 16 characters
READY_S = 90.0  # a hang guard for start-up, not a measurement


class RealHermes:
    def __init__(self, model: FakeAgentModel, home: Path, *, key: str = REAL_KEY,
                 max_concurrent_runs: int | None = None) -> None:
        if not HERMES_BIN.exists():
            raise RuntimeError(f"hermes-agent {HERMES_VERSION} is not installed at {HERMES_BIN}; run `make setup`")
        self.home, self.key, self.port = home, key, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        home.mkdir(parents=True, exist_ok=True)
        (home / ".env").write_text(f"API_SERVER_ENABLED=true\nAPI_SERVER_KEY={key}\nAPI_SERVER_HOST=127.0.0.1\n"
                                   f"API_SERVER_PORT={self.port}\n")
        cap = f"gateway:\n  api_server:\n    max_concurrent_runs: {max_concurrent_runs}\n" \
            if max_concurrent_runs is not None else ""
        (home / "config.yaml").write_text(
            f"model:\n  provider: custom\n  base_url: {model.url}\n  api_key: fake-model-key\n  default: {MODEL}\n"
            f"  context_length: 128000\napprovals:\n  mode: manual\nplatform_toolsets:\n  api_server: [terminal]\n"
            f"{cap}")

    def start(self) -> RealHermes:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.home), "HERMES_HOME": str(self.home),
               "LANG": "C.UTF-8", "NO_COLOR": "1"}
        log = open(self.home / "gateway.out", "ab")  # noqa: SIM115 - the process owns it
        self.process = subprocess.Popen([str(HERMES_BIN), "gateway", "run"], env=env, cwd=self.home,
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        log.close()
        self._wait_listening()
        return self

    def _wait_listening(self) -> None:
        """Until its port takes connections (a start-up wait on another process, bounded; not a timing)."""
        assert self.process is not None
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"hermes gateway exited with {self.process.returncode}: "
                                   f"{(self.home / 'gateway.out').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"hermes gateway did not listen within {READY_S:g} s")

    def send(self, sig: int) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def wait_exit(self) -> int:
        assert self.process is not None
        code = self.process.wait(READY_S)
        self.process = None
        return code

    def kill(self, sig: int = signal.SIGKILL) -> int:
        """Send `sig` to the gateway's process group and wait for it to exit; its exit code."""
        self.send(sig)
        return self.wait_exit()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill(signal.SIGKILL)
