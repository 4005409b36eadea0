"""Background runs: durable tickets, the hermes-api and command lanes, the run service, delivery sinks."""

from runs.config import DEFAULT_COMMAND, DEFAULT_HERMES_URL, DEFAULT_LANES, LANE_NAMES, RunsConfig
from runs.core import Delivery, RunState, RunTicket, SteerReceipt, SteerState
from runs.repository import MIGRATIONS
from runs.results import (
    Answered,
    Delegated,
    NoteQueued,
    Refused,
    RunningAgents,
    RunResult,
    RunsOverview,
    RunStatus,
    StopOutcome,
    Stopped,
)
from runs.service import RunService, UnknownRun
from runs.sinks import Announcer, NotificationSink, NullSink, TerminalSink

__all__ = [
    "DEFAULT_COMMAND", "DEFAULT_HERMES_URL", "DEFAULT_LANES", "LANE_NAMES", "MIGRATIONS", "Announcer", "Answered",
    "Delegated", "Delivery", "NoteQueued", "NotificationSink", "NullSink", "Refused", "RunResult", "RunService",
    "RunState", "RunStatus", "RunTicket", "RunningAgents", "RunsConfig", "RunsOverview", "SteerReceipt",
    "SteerState", "StopOutcome", "Stopped", "TerminalSink", "UnknownRun",
]
