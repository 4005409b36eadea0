"""`switchboard doctor`: read-only diagnostics. Names settings, never prints their values."""

from __future__ import annotations

import ctypes.util
import platform
import sys
from dataclasses import dataclass

from .settings import Settings


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def run_checks(settings: Settings) -> list[Check]:
    checks = [_python(), _libopus(), _davey(), _nacl(), _terminal_audio()]
    checks.append(Check("settings", not settings.problems,
                        "; ".join(settings.problems) or "parsed without problems"))
    names = ", ".join(settings.present) or "none (defaults in use; see .env.example)"
    checks.append(Check("settings present", True, names))
    ops = len(settings.operator_user_ids)
    checks.append(Check("operators", True, f"{ops} configured" if ops else "none: nobody may run mutating tools"))
    return checks


def _python() -> Check:
    ok = sys.version_info >= (3, 11)
    return Check("python", ok, f"{platform.python_version()} ({'ok' if ok else 'needs 3.11 or newer'})")


def _libopus() -> Check:
    try:
        from voice.opus import OpusDecoder, load_libopus

        lib = load_libopus()
        OpusDecoder()
        version = ctypes.c_char_p
        lib.opus_get_version_string.restype = version
        return Check("libopus", True, lib.opus_get_version_string().decode())
    except Exception as exc:
        hint = "install it: apt-get install -y libopus0 (Debian/Ubuntu)"
        found = ctypes.util.find_library("opus")
        return Check("libopus", False, f"not loadable ({exc}); {hint}" + ("" if found else ""))


def _davey() -> Check:
    try:
        import davey

        return Check("davey", True, f"{davey.__version__} (DAVE protocol v{davey.DAVE_PROTOCOL_VERSION})")
    except Exception as exc:
        return Check("davey", False, f"not importable ({exc}); pip install davey==0.1.7")


def _nacl() -> Check:
    try:
        import nacl

        return Check("pynacl", True, nacl.__version__)
    except Exception as exc:
        return Check("pynacl", False, f"not importable ({exc})")


def _terminal_audio() -> Check:
    """Informational: `talk` on the terminal needs sounddevice, PortAudio and a device."""
    try:
        import sounddevice

        devices = sounddevice.query_devices()
        inputs = sum(1 for d in devices if d.get("max_input_channels", 0) > 0)
        outputs = sum(1 for d in devices if d.get("max_output_channels", 0) > 0)
        return Check("terminal audio", True, f"PortAudio ok, {inputs} input / {outputs} output devices"
                     + ("" if inputs and outputs else " (talk needs both; --input-wav works without)"))
    except Exception as exc:
        return Check("terminal audio", True, f"unavailable ({type(exc).__name__}); for `talk` on a microphone: "
                     "pip install '.[audio]' and apt-get install -y libportaudio2")


def render(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    return "\n".join(f"{'ok ' if c.ok else 'BAD'}  {c.name:<{width}}  {c.detail}" for c in checks)
