"""Smartnumbers transcript listener (archive, facts, callbacks, named commands) — a later issue."""
