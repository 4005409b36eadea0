"""The Switchboard service: settings, composition, CLI, Discord adapter."""

from voice import __version__

__all__ = ["__version__"]
