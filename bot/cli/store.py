"""`switchboard store copy --to URL`: move this home's SQLite store into an empty PostgreSQL database.

The steps (the copy itself is `common.store.copy`):
1. The home's store is opened as any command opens it (upgraded to this version's schema, if older),
   then closed; it must not be in use (a `-wal` left means a process still has it open: what it wrote
   during the copy would be lost).
2. The target must hold no data: otherwise one line, exit 2, nothing written.
3. The target's tables are made by the same migrations every process applies at start.
4. Every row of every table goes across in one transaction (ids kept, sequences advanced past them),
   with progress on stderr for large tables, and a count per table on stdout at the end.

Exit codes: 0 copied, 2 usage, a bad URL, a store that cannot be read, a target that holds data.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, TextIO

from bot.cli.args import EXIT_USAGE
from bot.setting_rules import malformed_url
from bot.settings import Settings
from common.paths import home_problem
from common.store import DATABASE_URL_SCHEMES, DB_FILENAME, StoreError

PROGRESS_FROM = 50_000  # rows: smaller tables copy in a moment, without a progress line


def add_parser(subparsers: Any) -> None:
    store = subparsers.add_parser("store", help="the store: copy this home's SQLite store into PostgreSQL",
                                  description="The store that holds runs, the call archive, memory and call "
                                              "records. Exit codes: 0 done, 2 usage, a bad URL, a store that "
                                              "cannot be read, or a target that already holds data.")
    actions = store.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    copy = actions.add_parser("copy", help="copy every row of this home's SQLite store into an empty PostgreSQL "
                                           "database",
                              description="Copy every row of every table of SWITCHBOARD_HOME's SQLite store into "
                                          "an empty PostgreSQL database, ids kept, in one transaction: all or "
                                          "nothing. Stop `switchboard run`/`listen` first. Then set "
                                          "SWITCHBOARD_DATABASE_URL to the same URL (docs/deploy.md). Exit "
                                          "codes: 0 copied, 2 a bad URL, a store that cannot be read, or a target "
                                          "that already holds data (nothing is written).")
    copy.add_argument("--to", required=True, metavar="URL",
                      help="the target: postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME[?sslmode=…]; its database "
                           "must exist and hold no data (the password is never printed)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(main(args, settings))


async def main(args: argparse.Namespace, settings: Settings, *, out: TextIO | None = None,
               err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        counts = await copy_home(settings, args.to, err)
    except StoreError as exc:
        print(f"switchboard store copy: {exc}", file=err)
        return EXIT_USAGE
    width = max(map(len, counts), default=5)
    print(f"{'table':<{width}}  rows", file=out)
    for table, rows in sorted(counts.items()):
        print(f"{table:<{width}}  {rows:,}", file=out)
    print(f"copied {sum(counts.values()):,} rows in {len(counts)} tables; now set SWITCHBOARD_DATABASE_URL to this "
          f"URL for every process (docs/deploy.md)", file=err)
    return 0


async def copy_home(settings: Settings, url: str, err: TextIO) -> dict[str, int]:
    """Copy SWITCHBOARD_HOME's SQLite store into the database `url` names; the rows per table. Raises
    StoreError (one line, never the password) with nothing written to the target."""
    import psycopg

    from bot.services import STORE_MIGRATIONS
    from common.store import open_store
    from common.store.copy import CopyError, copy_rows, target_data, versions_differ
    from common.store.errors import failure_line
    from common.store.postgres import where_of
    from common.store.readonly import reading

    if not url.startswith(DATABASE_URL_SCHEMES):
        scheme = url.split("://", 1)[0][:20] if "://" in url else "none"
        raise StoreError(f"--to must be a postgresql:// or postgres:// URL (its scheme is {scheme})")
    if problem := malformed_url(url):
        raise StoreError(f"--to is not a well-formed URL ({problem}): use postgresql://USER:PASSWORD@HOST:PORT/DBNAME")
    if problem := home_problem(settings.home):
        raise StoreError(problem)
    home = settings.home.expanduser()
    await (await open_store(home, STORE_MIGRATIONS, create=False)).close()  # upgraded, as any command would
    source = home / DB_FILENAME
    if source.with_name(DB_FILENAME + "-wal").exists():
        raise StoreError(f"{source} is in use by another process (switchboard run, listen or talk): stop it first, "
                         f"or what it writes during the copy would be lost; nothing was copied")
    where = where_of(url)
    try:
        with psycopg.connect(url, connect_timeout=10) as target:
            if held := target_data(target):
                raise StoreError(f"{where} already holds data (in {', '.join(held[:5])}"
                                 f"{', …' if len(held) > 5 else ''}): copy only into an empty database; nothing "
                                 f"was written")
            target.rollback()
            await (await open_store(home, STORE_MIGRATIONS, database_url=url)).close()  # the tables
            with reading(source) as db:
                if differ := versions_differ(db, target):
                    raise StoreError(f"the schemas differ ({'; '.join(differ)}): copy with the same Switchboard "
                                     f"version that runs against {where}; nothing was copied")
                target.rollback()
                return copy_rows(db, target, progress=_progress(err))
    except CopyError as exc:
        raise StoreError(f"{where}: {exc}") from None
    except psycopg.Error as exc:
        raise StoreError(f"cannot use {where} (--to): {failure_line(exc, url)}; nothing was copied") from None


def _progress(err: TextIO):
    """A line per tenth of each large table (in place on a terminal)."""
    shown: dict[str, int] = {}
    live = err.isatty()

    def show(table: str, done: int, total: int) -> None:
        if total < PROGRESS_FROM:
            return
        tenth = done * 10 // total
        if shown.get(table) == tenth:
            return
        shown[table] = tenth
        line = f"{table}: {done:,} of {total:,} rows ({done * 100 // total}%)"
        print(f"\r{line}" if live else line, end="" if live and done < total else "\n", file=err, flush=True)

    return show
