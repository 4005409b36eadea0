"""Lanes: the ways a background run reaches an agent (Hermes api_server, a one-shot command)."""

from runs.lanes.base import AlreadyEnded, Emit, Lane, LaneError, LaneProbe, LaneSnapshot, SubmitUnknown
from runs.lanes.command import CommandLane
from runs.lanes.hermes_api import HermesApiLane

__all__ = ["AlreadyEnded", "CommandLane", "Emit", "HermesApiLane", "Lane", "LaneError", "LaneProbe", "LaneSnapshot",
           "SubmitUnknown"]
