"""Where things are, for tests in any folder: the project root and this support folder."""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parent.parent
FAKE_AGENT = str(SUPPORT / "fake_agent.py")
