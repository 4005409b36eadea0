"""Phone calls in the app: the listener service, its jobs as runs, and where their results land."""
