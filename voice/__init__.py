"""Between ears and mouth: Discord RTP receive, playback, audio conversion, the call engine."""

__version__ = "0.1.0"
