"""Slash commands, one `app_commands.Group` per topic, each depending on a small context protocol."""
