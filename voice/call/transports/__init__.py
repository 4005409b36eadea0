"""Where a call's audio comes from and goes to: Discord, the terminal, or WAV files."""
