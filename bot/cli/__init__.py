"""One module per `switchboard` command (`main` parses the command line and dispatches to them).

Every command builds what it needs through the one composition root, `bot.services`."""
