"""The Smartnumbers listener: a phone call's transcript, from the stream to its jobs.

Read in the order it happens (the app's half, from a job's run to a Discord post, is in `bot.phone`):

1. `stream.StreamClient` holds the WebSocket to Smartnumbers (key in a header, approved hosts only),
   answers each event with an ack, and reconnects with backoff.
2. `pipeline.TranscriptPipeline.handle(event)` runs one event: `download.TranscriptDownloader` fetches
   the presigned transcript URL (`addresses` refuses private and metadata addresses, the size is
   capped); `transcript.parse` reads its formats into a `model.Transcript`; `archive.Archive` commits
   it (searchable, FTS5) before anything is acknowledged.
3. Beside each other: `extract.FactExtractor` + `memory.validate` keep durable facts the user stated
   (verbatim quotes, checked in code), and `jobs` builds the review, each enabled callback
   (`callbacks`) and each named command the user spoke (`named_commands.find_commands`, "Ares, …").
4. Each job is claimed in `ledger.ExecutionLedger` under a stable key, then started through the
   `JobStarter` the app injects — in Switchboard, as a background run (`bot.phone.listener.RunJobs`).
5. The pipeline asks its `CallNotifier` to post the call card, and acks the event.

Every statement on the listener's tables is in `repository`. Callers' words are untrusted text
throughout: they are quoted, never followed, and never authorise anything.
"""
