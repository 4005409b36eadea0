"""The runs service's configuration: one frozen object the composition root fills from settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from runs.agent_command import check_agent_env

LANE_NAMES = ("hermes-api", "command")
DEFAULT_LANES = ("hermes-api", "command")
DEFAULT_HERMES_URL = "http://127.0.0.1:8642"
DEFAULT_COMMAND = ("hermes", "-z", "{task}")


@dataclass(frozen=True)
class RunsConfig:
    """How background runs are started, watched and bounded.

    `hermes_key`: None or "" sends no Authorization header. `profile` applies when the command's
    program is `hermes`: None = auto-detect, "" = explicit opt-out, a name = `--profile NAME`.
    `command`: an argv template; every `{task}` inside an element is replaced by the task text, and
    the task always stays inside that one element (no shell is involved). `agent_env`: names of extra
    variables the command's agent may see beyond the allow-list (`agent_command.AGENT_ENV_NAMES`);
    a secret's name is refused (ValueError), never passed. `workdir`: the folder the command's agent
    starts in (created owner-only when missing) — never Switchboard's own working folder, where its
    `.env` may be; None: a new private temporary folder per process. `hermes_max_runs`: how many runs
    the hermes-api lane keeps going at Hermes at once (its api_server's `max_concurrent_runs`, 10 by
    default); more wait their turn in Switchboard.
    """

    lanes: tuple[str, ...] = DEFAULT_LANES
    hermes_url: str = DEFAULT_HERMES_URL
    hermes_key: str | None = None
    command: tuple[str, ...] = DEFAULT_COMMAND
    profile: str | None = None
    timeout_s: float = 1800.0
    output_cap_bytes: int = 64 * 1024
    approval_timeout_s: float = 120.0
    hermes_home: Path = field(default_factory=lambda: Path("~/.hermes").expanduser())
    stop_grace_s: float = 5.0
    probe_timeout_s: float = 2.0
    poll_interval_s: float = 5.0
    spoken_chars: int = 600
    agent_env: tuple[str, ...] = ()
    workdir: Path | None = None
    hermes_max_runs: int = 10

    def __post_init__(self) -> None:
        unknown = [lane for lane in self.lanes if lane not in LANE_NAMES]
        if unknown:
            raise ValueError(f"unknown agent lanes {unknown}; use any of {', '.join(LANE_NAMES)}")
        if len(set(self.lanes)) != len(self.lanes):
            raise ValueError(f"agent lanes repeat: {list(self.lanes)}")
        for name in ("timeout_s", "approval_timeout_s", "stop_grace_s", "probe_timeout_s", "poll_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.hermes_max_runs < 1:
            raise ValueError("hermes_max_runs must be at least 1")
        if self.output_cap_bytes < 256:
            raise ValueError("output_cap_bytes must be at least 256")
        object.__setattr__(self, "agent_env", check_agent_env(self.agent_env))
