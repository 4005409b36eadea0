"""Leaf helpers below every domain: the store (SQLite or PostgreSQL), this host's process identity, path
checks, URL and loopback rules, the shared TLS context, redaction, and escaping of untrusted text.
Nothing here imports `bot`, `voice`, `runs` or `listener`."""
