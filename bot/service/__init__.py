"""The Discord service: `switchboard run`, slash commands, the operator gate, channel notifications."""
