"""Leaf helpers below every domain: the SQLite store, path checks, URL and loopback rules, the shared TLS
context, redaction, and escaping of untrusted text. Nothing here imports `bot`, `voice`, `runs` or
`listener`."""
