"""Phone calls in the app: the listener's jobs become runs, and their results become Discord posts.

Read in the order it happens (the listener's half, from the stream to a started job, is in `listener`):

1. `bot.phone.listener.Listener` (built by `bot.services.Services.listener`) runs the Smartnumbers stream over
   the transcript pipeline; `RunJobs.start_job` starts each job as a background run
   (`runs.RunService.delegate`, idempotent on the job's key), and the card goes to the notifier.
2. `delivery.ListenerDelivery` is both that notifier and the runs service's sink: it posts the call
   card through its `ResultPoster` and records the card's reference; when a run finishes it finds
   the run's job in the ledger and hands a `JobResult` to the poster, under the call's card or in the
   job's own channel — or to the usual runs sink when the run is not a listener job.
3. The poster is `bot.discord.phone_cards.DiscordPoster` in `switchboard run` (embeds through
   `bot.discord.posts.send`: nobody pinged, a refused post is one line) and `TerminalPoster` in
   `switchboard listen`. A result waiting for its card, or refused by Discord, is kept and posted by
   `delivery.flush_waiting()` at the next start.
"""
