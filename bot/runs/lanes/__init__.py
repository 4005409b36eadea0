"""Lanes: the ways a background run reaches an agent (Hermes api_server, a one-shot command)."""

from .base import Emit, Lane, LaneError, LaneProbe, LaneSnapshot
from .command import CommandLane
from .hermes_api import HermesApiLane

__all__ = ["CommandLane", "Emit", "HermesApiLane", "Lane", "LaneError", "LaneProbe", "LaneSnapshot"]
