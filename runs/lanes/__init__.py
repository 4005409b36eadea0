"""Lanes: the ways a background run reaches an agent (Hermes api_server, a one-shot command)."""

from runs.lanes.base import Emit, Lane, LaneError, LaneProbe, LaneSnapshot
from runs.lanes.command import CommandLane
from runs.lanes.hermes_api import HermesApiLane

__all__ = ["CommandLane", "Emit", "HermesApiLane", "Lane", "LaneError", "LaneProbe", "LaneSnapshot"]
