"""The command lane's argv: template substitution and Hermes profile auto-detection (no shell)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from common.redact import secret_forms

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


# The agent reads untrusted call transcripts, so it gets an allow-list, never Switchboard's environment:
# what a CLI needs to run as you (programs, who and where you are, terminal, locale, time zone,
# temporary and XDG directories), Hermes's own variables, and where Switchboard's store is (an agent
# asked to change callbacks runs `switchboard callbacks`). docs/runs.md lists the same.
AGENT_ENV_NAMES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "TZ", "TMPDIR",
                             "SWITCHBOARD_HOME"})
AGENT_ENV_PREFIXES = ("LC_", "XDG_", "HERMES_")
AGENT_ENV_VARIABLE = "SWITCHBOARD_AGENT_ENV"
# Every variable Switchboard reads a secret from (bot.settings.SECRET_VARIABLES, which a test keeps
# inside this set) and a run's callback token: never passed, not even when asked for by name.
BOT_SECRET_VARIABLES = frozenset({
    "DISCORD_BOT_TOKEN", "SWITCHBOARD_DISCORD_TOKEN", "SWITCHBOARD_OPENAI_API_KEY", "OPENAI_API_KEY",
    "XAI_API_KEY", "SWITCHBOARD_HERMES_API_KEY", "API_SERVER_KEY", "TRANSCRIPT_LISTENER_API_KEY",
    "SWITCHBOARD_TEXT_API_KEY", "SWITCHBOARD_CALLBACK_TOKEN", "SWITCHBOARD_DATABASE_URL",
})
# Variables that make a program load or run code of the variable's choosing (the dynamic loader, shell
# start-up files, interpreters' module paths and options, git's and ssh's helper commands): never passed
# on request — the agent reads untrusted transcripts, and such a value turns a variable into a program.
CODE_HOOK_VARIABLES = frozenset({
    "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PROMPT_COMMAND", "PS4", "IFS", "CDPATH", "GLOBIGNORE",
    "GCONV_PATH", "LOCPATH", "NLSPATH", "HOSTALIASES", "RESOLV_HOST_CONF", "MALLOC_CHECK_", "GETCONF_DIR",
    "SSH_ASKPASS", "SUDO_ASKPASS", "EDITOR", "VISUAL", "PAGER", "BROWSER", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS",
    "JAVA_TOOL_OPTIONS", "CLASSPATH", "ZDOTDIR", "INPUTRC",
})
CODE_HOOK_PREFIXES = ("LD_", "DYLD_", "PYTHON", "PERL", "RUBY", "NODE_", "NPM_CONFIG_", "GIT_", "BASH_FUNC_",
                      "LUA_", "GEM_", "BUNDLE_", "TCL", "R_PROFILE", "OPENSSL_")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WHOLE_VALUE_BELOW = 8  # a secret shorter than this withholds only a variable that is exactly it


class AgentEnvError(ValueError):
    """SWITCHBOARD_AGENT_ENV asks for something the agent may not have; the message says what."""


def check_agent_env(names: Sequence[str]) -> tuple[str, ...]:
    """The extra variable names an operator passes to the agent, checked: each a plain variable name,
    none of them — in any letter case — a secret Switchboard holds, one of Switchboard's own settings
    or a variable that makes a program load or run code (CODE_HOOK_VARIABLES, CODE_HOOK_PREFIXES).
    Raises AgentEnvError."""
    checked: list[str] = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        if not _NAME.fullmatch(name):
            raise AgentEnvError(f"{AGENT_ENV_VARIABLE}: {name!r} is not a variable name (letters, digits and _)")
        upper = name.upper()
        if upper in BOT_SECRET_VARIABLES:
            raise AgentEnvError(f"{AGENT_ENV_VARIABLE}: {name} holds one of Switchboard's secrets, which the agent "
                                f"never gets; give the agent its own key in its own configuration (for Hermes: "
                                f"$HERMES_HOME/.env)")
        if upper.startswith("SWITCHBOARD_") and upper not in AGENT_ENV_NAMES:
            raise AgentEnvError(f"{AGENT_ENV_VARIABLE}: {name} is Switchboard's own setting, not the agent's")
        if upper in CODE_HOOK_VARIABLES or upper.startswith(CODE_HOOK_PREFIXES):
            raise AgentEnvError(f"{AGENT_ENV_VARIABLE}: {name} makes programs load or run code of its choosing, "
                                f"so the agent never gets it; set it in the agent's own configuration if it needs it")
        if name not in checked:
            checked.append(name)
    return tuple(checked)


def parse_agent_env(text: str | None) -> tuple[str, ...]:
    """SWITCHBOARD_AGENT_ENV (`NAME,NAME`; blank or unset: none) → checked names. Raises AgentEnvError."""
    return check_agent_env((text or "").replace(";", ",").split(","))


def _withheld(value: str, secrets: Sequence[str], forms: Sequence[str]) -> bool:
    """Whether `value` is one of `secrets`, or holds one of their `forms`."""
    return value in secrets or any(form in value for form in forms)


def child_environment(env: Mapping[str, str], extra: Sequence[str] = (),
                      withhold: Sequence[str] = ()) -> dict[str, str]:
    """The agent's environment: only the allow-listed variables of `env` (AGENT_ENV_NAMES, names
    starting with AGENT_ENV_PREFIXES, and the `extra` names, checked here again by `check_agent_env`:
    AgentEnvError for a secret's name or a code hook), and never one whose value carries a secret
    Switchboard holds (`withhold`), plain or encoded."""
    allowed = set(AGENT_ENV_NAMES) | set(check_agent_env(extra))
    secrets = [s for s in withhold if s]
    # held inside a longer value in any form `common.redact.secret_forms` knows: escaped, percent, hex, base64
    forms = [f for s in secrets if len(s) >= _WHOLE_VALUE_BELOW for f in secret_forms(s)]
    return {k: v for k, v in env.items()
            if (k in allowed or k.startswith(AGENT_ENV_PREFIXES)) and not _withheld(v, secrets, forms)}


def program_on_path(template: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    path = (env if env is not None else os.environ).get("PATH")
    return shutil.which(template[0], path=path) if template else None
