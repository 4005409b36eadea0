"""Background runs: durable tickets, the hermes-api and command lanes, voice tools, the `runs` CLI."""

from .config import DEFAULT_COMMAND, DEFAULT_HERMES_URL, DEFAULT_LANES, LANE_NAMES, RunsConfig
from .core import Delivery, RunState, RunTicket, SteerReceipt, SteerState
from .notify import Announcer, NotificationSink, NullSink, TerminalSink
from .repository import MIGRATIONS
from .service import RunService, UnknownRun
from .tools import run_tools, speaker_of

__all__ = [
    "DEFAULT_COMMAND", "DEFAULT_HERMES_URL", "DEFAULT_LANES", "LANE_NAMES", "MIGRATIONS", "Announcer", "Delivery",
    "NotificationSink", "NullSink", "RunService", "RunState", "RunTicket", "RunsConfig", "SteerReceipt",
    "SteerState", "TerminalSink", "UnknownRun", "run_tools", "speaker_of",
]
