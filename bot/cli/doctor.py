"""`switchboard doctor`: read-only diagnostics. Names settings, never prints their values.

Every row that can fail says what to do. `BAD` rows make doctor exit 1; `warn` rows (an optional
feature that is unavailable, an ignored variable) do not.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bot.fleet.http import describe
from bot.settings import KEY_VARIABLES, SettingsError, SettingsReport, key_variable, realtime_api_key
from common.paths import output_problem
from voice.call.providers import PROVIDERS

Status = Literal["ok", "warn", "bad"]
PY = shlex.quote(sys.executable)  # this venv's Python: `pip`/`python` on PATH may be another
_LABEL = {"ok": "ok  ", "warn": "warn", "bad": "BAD "}


@dataclass
class Check:
    name: str
    status: Status
    detail: str

    @property
    def ok(self) -> bool:
        return self.status != "bad"


# The settings each group of rows reads: when one of them is malformed, the group says so instead of
# checking the default that stands in for it (which would be a silent wrong answer).
_TOKEN = ("DISCORD_BOT_TOKEN", "SWITCHBOARD_DISCORD_TOKEN")
_READS = {
    "store": ("SWITCHBOARD_HOME", "SWITCHBOARD_DATABASE_URL"),
    "latency log": ("SWITCHBOARD_LATENCY_LOG",),
    "call modes": ("SWITCHBOARD_REPLY_TO", "SWITCHBOARD_FOLLOWUP_S", "SWITCHBOARD_CAPTIONS",
                   "SWITCHBOARD_CALL_MAX_MINUTES", "SWITCHBOARD_SESSION_ROLLOVER_S"),
    "discord": (*_TOKEN, "SWITCHBOARD_RUNS_CHANNEL_ID", "SWITCHBOARD_HOME"),
    "listener": ("TRANSCRIPT_LISTENER_API_KEY", "SMARTNUMBERS_STREAM_URL", "SMARTNUMBERS_ALLOWED_STREAM_HOSTS",
                 "SMARTNUMBERS_ALLOW_INSECURE_LOCAL", "SWITCHBOARD_AGENT_NAME", "SWITCHBOARD_ACTIVATION_NAMES"),
    "after each call": ("TRANSCRIPT_LISTENER_API_KEY", "SWITCHBOARD_TEXT_MODEL", "SWITCHBOARD_TEXT_URL",
                        "SWITCHBOARD_TEXT_API_KEY", "SWITCHBOARD_OPENAI_API_KEY", "OPENAI_API_KEY",
                        "SWITCHBOARD_TRANSCRIPTS_CHANNEL_ID", "SWITCHBOARD_AUTO_REVIEW", "SWITCHBOARD_HOME"),
    "recaps": ("SWITCHBOARD_TEXT_MODEL", "SWITCHBOARD_TEXT_URL", "SWITCHBOARD_TEXT_API_KEY", "SWITCHBOARD_OPENAI_API_KEY",
               "OPENAI_API_KEY"),
    "agent lanes": ("SWITCHBOARD_AGENT_LANES", "SWITCHBOARD_HERMES_API_URL", "SWITCHBOARD_HERMES_API_KEY",
                    "API_SERVER_KEY", "SWITCHBOARD_AGENT_COMMAND", "SWITCHBOARD_AGENT_PROFILE",
                    "SWITCHBOARD_AGENT_TIMEOUT_S"),
    "health endpoint": ("SWITCHBOARD_HTTP_ADDR",),
}


def run_checks(report: SettingsReport, env_source: str = "") -> list[Check]:
    """Every row, whatever is wrong: a malformed setting is its own BAD row, and the rows that read
    it say they were not checked; every other row is checked as usual."""
    checks = [_python(), _libopus(), _davey(), _nacl(), _terminal_audio()]
    if env_source:
        checks.append(Check("env file", "ok", env_source))
    checks += [Check("settings", "bad", problem) for problem in report.problems]
    if not report.problems:
        checks.append(Check("settings", "ok", "parsed without problems"))
    checks += [Check("settings", "warn", line) for line in report.ignored]
    names = ", ".join(report.settings.present) or "none (defaults in use; see .env.example)"
    checks.append(Check("settings present", "ok", names))
    checks.append(_provider_key(report))
    checks.append(_operators(report))
    settings = report.settings
    checks += _unless_failed(report, "store", lambda: [_home(settings)])
    checks += _unless_failed(report, "latency log", lambda: [_latency_log(settings)])
    checks += _unless_failed(report, "call modes", lambda: [_call_modes(settings)])
    checks += _unless_failed(report, "discord", lambda: _discord(settings))
    if settings.discord_token is not None:
        checks += _unless_failed(report, "recaps", lambda: [_recaps(settings)])
    checks += _unless_failed(report, "listener", lambda: [_listener(settings)])
    if settings.listener_key is not None or "TRANSCRIPT_LISTENER_API_KEY" in report.failed:
        checks += _unless_failed(report, "after each call", lambda: _post_call(settings))
    checks += _unless_failed(report, "agent lanes", lambda: agent_lanes(settings))
    checks += _unless_failed(report, "health endpoint", lambda: [Check("health endpoint", "ok",
                                                                       describe(settings.http_addr))])
    return checks


def _unless_failed(report: SettingsReport, rows: str, check: Callable[[], list[Check]]) -> list[Check]:
    failed = [name for name in _READS[rows] if name in report.failed]
    if failed:
        return [Check(rows, "bad", f"not checked: fix {' and '.join(failed)} first (above)")]
    return check()


def _discord(settings) -> list[Check]:
    from bot.discord.invite import application_id, invite_url

    token = settings.discord_token.get_secret_value() if settings.discord_token is not None else ""
    if not token:
        return [Check("discord", "warn", "DISCORD_BOT_TOKEN is not set: `switchboard run` (the Discord bot) needs "
                                         "it; `switchboard talk` works without")]
    app = application_id(token)
    if app is None:
        return [Check("discord", "warn", "DISCORD_BOT_TOKEN does not look like a bot token (three dot-separated "
                                        "parts, the first the bot's id); copy it again: Developer Portal → Bot → "
                                        "Reset Token")]
    rows = [Check("discord", "ok", f"token for application {app} (value not checked with Discord here); invite "
                                   f"the bot: {invite_url(app)}")]
    if settings.runs_channel_id is None:
        rows.append(Check("runs channel", "warn", "SWITCHBOARD_RUNS_CHANNEL_ID is not set: finished runs are "
                                                  "said in the call but not posted"))
    else:
        rows.append(_last_post(settings))
    if (calls := _calls_to_resume(settings)) is not None:
        rows.append(calls)
    return rows


def _recaps(settings) -> Check:
    """What a call's recap can hold: the summary and the debrief need the text model."""
    from bot.settings import text_model_key

    key, source = text_model_key(settings)  # its URL was checked with the settings (`_READS["recaps"]`)
    if not key:
        return Check("recaps", "warn", f"posted without a summary, and calls are not debriefed into memory: set "
                                       f"{source} for the text model")
    return Check("recaps", "ok", f"summaries and debriefs by {settings.text_model} at {settings.text_url} (key from "
                                 f"{source}, not shown)")


def _calls_to_resume(settings) -> Check | None:
    """Voice calls the next `switchboard run` rejoins (read-only); None when there are none."""
    import sqlite3

    from voice.call.records import unfinished_calls

    try:
        with _store(settings) as db:
            counts = unfinished_calls(db) if db is not None else {}
    except sqlite3.Error:
        return None
    if not counts:
        return None
    total = sum(counts.values())
    how = ", ".join(f"{n} {what}" for what, n in (("left by a crash", counts.get("live", 0)),
                                                    ("stopped for a restart", counts.get("resume", 0))) if n)
    return Check("calls", "ok", f"{total} voice call{'s' * (total != 1)} not ended ({how}): a running "
                                "`switchboard run` is in them; otherwise the next one rejoins each whose channel "
                                "still has someone in it")


def _listener(settings) -> Check:
    from bot.phone.listener import listener_problem

    if settings.listener_key is None:
        return Check("listener", "warn", "off: TRANSCRIPT_LISTENER_API_KEY is not set (phone-call transcripts are "
                                         "not received; everything else works)")
    if problem := listener_problem(settings):
        return Check("listener", "bad", problem)
    return Check("listener", "ok", f"stream {settings.stream_url.split('?')[0]} (key from TRANSCRIPT_LISTENER_API_KEY, "
                                   f"not shown); agent name {settings.agent_name!r}"
                                   + (f", also {', '.join(settings.activation_names)}" if settings.activation_names else ""))


def _post_call(settings) -> list[Check]:
    """Memory, where call cards go, and what runs after each call (read-only from the store)."""
    import sqlite3

    from bot.settings import text_model_key
    from listener.repository import callback_switches, last_failed_post, results_waiting

    key, source = text_model_key(settings)
    rows = [Check("memory", "ok", f"durable facts from each call by {settings.text_model} at {settings.text_url} "
                                  f"(key from {source}, not shown)") if key else
            Check("memory", "warn", f"off: no key for the text model; set {source} to learn facts from calls")]
    if settings.transcripts_channel_id is None:
        rows.append(Check("transcripts channel", "warn", "SWITCHBOARD_TRANSCRIPTS_CHANNEL_ID is not set: call cards "
                                                         "and results are kept in the archive, not posted"))
    else:
        rows.append(Check("transcripts channel", "ok", f"call cards and results go to {settings.transcripts_channel_id}"))
    callbacks, review, failed, waiting = [], False, None, 0
    with contextlib.suppress(sqlite3.Error), _store(settings) as db:  # an error: no listener tables yet
        if db is not None:
            for cid, enabled in callback_switches(db):
                if cid == "default-review":
                    review = enabled
                elif enabled:
                    callbacks.append(cid)
            failed = last_failed_post(db)
            waiting = results_waiting(db)
    review_words = ("off (SWITCHBOARD_AUTO_REVIEW=false)" if not settings.auto_review else "on" if review else
                    "off (no review instructions: say \"set my call review to …\" in `switchboard talk` or as "
                    "an operator in a Discord call)")
    rows.append(Check("after each call", "ok", f"review {review_words}; {len(callbacks)} callback(s) enabled"
                                               + (f": {', '.join(callbacks[:5])}" if callbacks else "")))
    if waiting:
        rows.append(Check("after each call", "warn", f"{waiting} result(s) wait for their call's card, which "
                                                     "Discord has not taken yet (see `switchboard transcripts show`)"))
    if failed is not None:
        rows.append(Check("after each call", "warn", f"the last result post ({failed[0][:60]!r}) failed: "
                                                     f"{failed[1][len('post failed: '):][:200]}"))
    return rows


def _last_post(settings) -> Check:
    """The last run post's outcome, read from the store without changing it."""
    import sqlite3

    from runs.repository import last_post_event

    channel = settings.runs_channel_id
    try:
        with _store(settings) as db:
            row = last_post_event(db) if db is not None else None
    except sqlite3.Error:
        row = None
    if row is None:
        return Check("runs channel", "ok", f"{channel}; nothing posted yet")
    run_id, kind, detail = row
    if kind == "post_failed":
        return Check("runs channel", "warn", f"the last post (run {run_id}) failed: {detail}")
    return Check("runs channel", "ok", f"{channel}; run {run_id} was the last posted")


def _store(settings):
    """The store, read-only, on whichever engine is configured (`common.store.report.reading_store`)."""
    from bot.services import database_url
    from common.store.report import reading_store

    return reading_store(settings.home, database_url=database_url(settings))


def _home(settings) -> Check:
    """The store row: its engine and server, the migrations applied, read without changing anything.
    SQLite: home_problem (not a directory, /proc, no permission), then the file itself (a directory or
    device in its place, not SQLite, damaged, read-only for this user, from a newer Switchboard)."""
    from bot.services import STORE_MIGRATIONS, database_url
    from common.store.report import store_report

    report = store_report(settings.home, STORE_MIGRATIONS, database_url=database_url(settings))
    return Check("store", "ok" if report.ok else "bad", report.detail)


def _latency_log(settings) -> Check:
    if settings.latency_log is None:
        return Check("latency log", "ok", "off (set SWITCHBOARD_LATENCY_LOG, or pass talk --metrics-json)")
    if problem := output_problem(settings.latency_log, "SWITCHBOARD_LATENCY_LOG"):
        return Check("latency log", "bad", problem)
    return Check("latency log", "ok", f"appended to {settings.latency_log}")


def _call_modes(settings) -> Check:
    """What a voice call starts with (`/talk mode` and `/talk captions` change one call's)."""
    limit = f"{settings.call_max_minutes:g} min" if settings.call_max_minutes is not None else "none"
    return Check("call modes", "ok", f"reply to {settings.reply_to} (follow-up window {settings.followup_s:g} s in "
                                     f"addressed mode); captions {'on' if settings.captions else 'off'}; call "
                                     f"limit {limit}; session rollover after {settings.session_rollover_s:g} s")


def agent_lanes(settings) -> list[Check]:
    """One row per configured agent lane, probed as `delegate_task` would (warn: runs are optional)."""
    import asyncio

    from bot.services import runs_config
    from runs.service import default_lanes

    config = runs_config(settings)

    async def probe_all():
        lanes = [lane for lane in default_lanes(config, asyncio.sleep) if lane.name in config.lanes]
        try:
            return [await lane.probe() for lane in sorted(lanes, key=lambda lane: config.lanes.index(lane.name))]
        finally:
            for lane in lanes:
                await lane.aclose()

    rows = []
    for probe in asyncio.run(probe_all()):
        if probe.available:
            detail = "available" + ("" if probe.can_steer else
                                    " (this Hermes offers no steering: runs can be stopped, not steered)"
                                    if probe.lane == "hermes-api" else " (runs can be stopped, not steered)")
            rows.append(Check(f"agent lane {probe.lane}", "ok", detail))
        else:
            rows.append(Check(f"agent lane {probe.lane}", "warn", probe.detail))
    if rows and all(row.status == "warn" for row in rows):
        rows.append(Check("background runs", "warn", "no agent lane is available: delegate_task will refuse "
                                                     "until one is (see docs/runs.md)"))
    return rows


def command_name() -> str:
    """How to run this very switchboard again: `switchboard` when that is the one on PATH."""
    script = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(script) == "switchboard":
        on_path = shutil.which("switchboard")
        return "switchboard" if on_path and os.path.realpath(on_path) == script else shlex.quote(sys.argv[0])
    return f"{PY} -m bot"


def wav_hint() -> str:
    return f"{command_name()} talk --input-wav IN.wav --output-wav OUT.wav"


def exit_code(checks: list[Check]) -> int:
    return 0 if all(c.ok for c in checks) else 1


def render(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    return "\n".join(f"{_LABEL[c.status]}  {c.name:<{width}}  {c.detail}" for c in checks)


# -- settings rows -----------------------------------------------------------------------------------


def _provider_key(report: SettingsReport) -> Check:
    if "SWITCHBOARD_PROVIDER" in report.failed:
        return Check("provider key", "bad", "not checked: fix SWITCHBOARD_PROVIDER first (use "
                     f"{' or '.join(PROVIDERS)})")
    settings = report.settings
    failed_keys = [n for n in KEY_VARIABLES[settings.provider] if n in report.failed]
    if failed_keys:
        return Check("provider key", "bad", f"{failed_keys[0]} is malformed (see above)")
    try:
        realtime_api_key(settings)
    except SettingsError as exc:
        return Check("provider key", "bad", str(exc))
    return Check("provider key", "ok", f"{settings.provider} key from {key_variable(settings)} (value not shown)")


def _operators(report: SettingsReport) -> Check:
    if report.notices:
        return Check("operators", "bad", "; ".join(report.notices))
    ops = len(report.settings.operator_user_ids)
    if ops:
        return Check("operators", "ok", f"{ops} configured")
    token = report.settings.discord_token
    if token is not None and token.get_secret_value():
        return Check("operators", "warn", "nobody can use /talk join or run mutating tools in Discord: set "
                     "SWITCHBOARD_OPERATOR_USER_IDS to your Discord user ID (Developer Mode → right-click yourself "
                     "→ Copy User ID)")
    return Check("operators", "ok", "none: nobody may run mutating tools (set SWITCHBOARD_OPERATOR_USER_IDS "
                 "to Discord user IDs to allow someone)")


# -- the machine -------------------------------------------------------------------------------------


def _python() -> Check:
    ok = sys.version_info >= (3, 11)
    return Check("python", "ok" if ok else "bad",
                 platform.python_version() + ("" if ok else ": needs 3.11 or newer"))


def _libopus() -> Check:
    try:
        from voice.media.opus import OpusDecoder, load_libopus

        lib = load_libopus()
        OpusDecoder()
        lib.opus_get_version_string.restype = ctypes.c_char_p
        return Check("libopus", "ok", lib.opus_get_version_string().decode())
    except Exception as exc:
        return Check("libopus", "bad", f"not loadable ({exc}); install it: apt-get install -y libopus0 "
                     "(Debian/Ubuntu)")


def _davey() -> Check:
    try:
        import davey

        return Check("davey", "ok", f"{davey.__version__} (DAVE protocol v{davey.DAVE_PROTOCOL_VERSION})")
    except Exception as exc:
        return Check("davey", "bad", f"not importable ({exc}); {PY} -m pip install davey==0.1.7")


def _nacl() -> Check:
    try:
        import nacl

        return Check("pynacl", "ok", nacl.__version__)
    except Exception as exc:
        return Check("pynacl", "bad", f"not importable ({exc}); {PY} -m pip install PyNaCl==1.5.0")


def _terminal_audio() -> Check:
    """Optional: `talk` on the terminal needs sounddevice, PortAudio and an input and output device."""
    try:
        import sounddevice

        devices = sounddevice.query_devices()
    except Exception as exc:
        return Check("terminal audio", "warn", f"unavailable ({type(exc).__name__}); for `talk` on a microphone: "
                     f"{PY} -m pip install '.[audio]' and apt-get install -y libportaudio2; "
                     f"without audio devices: {wav_hint()}")
    inputs = sum(1 for d in devices if d.get("max_input_channels", 0) > 0)
    outputs = sum(1 for d in devices if d.get("max_output_channels", 0) > 0)
    counts = f"{inputs} input / {outputs} output device{'s' if outputs != 1 else ''}"
    if inputs and outputs:
        return Check("terminal audio", "ok", f"PortAudio, {counts}")
    return Check("terminal audio", "warn", f"PortAudio, but {counts}: `talk` on the terminal needs both "
                 f"(list them: {PY} -m sounddevice); without audio devices: {wav_hint()}")
