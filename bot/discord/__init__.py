"""The Discord adapter: the client, the calls it holds, per-topic slash-command groups, their checks,
and every post it makes."""
