"""The command lane's argv: template substitution and Hermes profile auto-detection (no shell)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

TASK = "{task}"
_TOP_KEY = re.compile(r"^([A-Za-z_][\w-]*)\s*:(.*)$")
_EMPTY = {"", "~", "null", "''", '""', "{}"}


class TemplateError(ValueError):
    """SWITCHBOARD_AGENT_COMMAND cannot be used; the message says why."""


def _scalar(value: str) -> str:
    value = value.split(" #", 1)[0].strip()
    return "" if value.startswith("#") else value


def names_model(config_text: str) -> bool:
    """Whether a Hermes config.yaml names a model: `model: NAME` or `model:` with a `default:` under it.

    A small reader for exactly this question (no YAML dependency): top-level keys start at column 0.
    """
    lines = config_text.splitlines()
    for i, line in enumerate(lines):
        match = _TOP_KEY.match(line)
        if not match or match.group(1) != "model":
            continue
        inline = _scalar(match.group(2))
        if inline.startswith("{"):
            found = re.search(r"\bdefault\s*:\s*([^,}]+)", inline)
            return bool(found and _scalar(found.group(1)) not in _EMPTY)
        if inline:
            return inline not in _EMPTY
        for child in lines[i + 1:]:
            if child.strip() == "" or child.lstrip().startswith("#"):
                continue
            if not child[:1].isspace():
                break
            key, _, value = child.strip().partition(":")
            if key.strip() == "default" and _scalar(value) not in _EMPTY:
                return True
        return False
    return False


def _reads_model(path: Path) -> bool:
    try:
        return names_model(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return False


def detect_profile(hermes_home: Path) -> str | None:
    """The one profile under `hermes_home/profiles/` that names a model, when the root config does not.

    None when the root config names a model, or when zero or several profiles do: guessing between
    profiles would pick the wrong agent silently; the spawn's own error is clearer.
    """
    if _reads_model(hermes_home / "config.yaml"):
        return None
    profiles = hermes_home / "profiles"
    try:
        candidates = sorted(p.name for p in profiles.iterdir()
                            if p.is_dir() and _reads_model(p / "config.yaml"))
    except OSError:
        return None
    return candidates[0] if len(candidates) == 1 else None


def is_hermes(template: Sequence[str]) -> bool:
    return bool(template) and Path(template[0]).name == "hermes"


def resolve_profile(template: Sequence[str], profile: str | None, hermes_home: Path) -> str | None:
    """The `--profile` for a `hermes` template: set → that name; set-but-blank → None (explicit
    opt-out); unset → auto-detected. Other programs get no flag (put it in their template)."""
    if not is_hermes(template):
        return None
    if profile is not None:
        return profile.strip() or None
    return detect_profile(hermes_home)


def check_template(template: Sequence[str]) -> None:
    if not template or not template[0].strip():
        raise TemplateError("SWITCHBOARD_AGENT_COMMAND is empty; set it to an argument template such as "
                            "`hermes -z {task}`")
    if not any(TASK in part for part in template):
        raise TemplateError("SWITCHBOARD_AGENT_COMMAND has no {task} placeholder, so the task would "
                            "never reach the agent; add {task} where the prompt goes")


def build_argv(template: Sequence[str], task: str, profile: str | None) -> list[str]:
    """The argv to exec: `{task}` substituted inside its own element; `--profile NAME` after the program."""
    check_template(template)
    argv = [part.replace(TASK, task) if TASK in part else part for part in template]
    if profile:
        argv[1:1] = ["--profile", profile]
    return argv


def child_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment: ours minus Switchboard's own variables (tokens and keys stay here)."""
    return {k: v for k, v in env.items() if not k.startswith("SWITCHBOARD_")}


def program_on_path(template: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    path = (env if env is not None else os.environ).get("PATH")
    return shutil.which(template[0], path=path) if template else None
