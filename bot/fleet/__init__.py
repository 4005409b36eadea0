"""The process as a member of a fleet: what it tells a supervisor and a scraper.

Read in order: `readiness` (starting → ready → draining, the state `/readyz` answers), `metrics`
(every metric declared in one place, read at scrape time from counters the domains already keep),
`readings` (where `switchboard run` and `switchboard listen` find those counters), `http` (the
`SWITCHBOARD_HTTP_ADDR` endpoint: `/healthz`, `/readyz`, `/metrics`). Shard leases and the drain's
hand-off are not built yet (issue 26): a process holds every shard it serves, and the drain today is
the shutdown that marks calls to resume.
"""
