"""Background runs: durable tickets, the hermes-api and command lanes, voice tools, the `runs` CLI."""

from runs.config import DEFAULT_COMMAND, DEFAULT_HERMES_URL, DEFAULT_LANES, LANE_NAMES, RunsConfig
from runs.core import Delivery, RunState, RunTicket, SteerReceipt, SteerState
from runs.repository import MIGRATIONS
from runs.service import RunService, UnknownRun
from runs.sinks import Announcer, NotificationSink, NullSink, TerminalSink
from runs.tools import run_tools, speaker_of

__all__ = [
    "DEFAULT_COMMAND", "DEFAULT_HERMES_URL", "DEFAULT_LANES", "LANE_NAMES", "MIGRATIONS", "Announcer", "Delivery",
    "NotificationSink", "NullSink", "RunService", "RunState", "RunTicket", "RunsConfig", "SteerReceipt",
    "SteerState", "TerminalSink", "UnknownRun", "run_tools", "speaker_of",
]
