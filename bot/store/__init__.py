"""The shared SQLite store: one database file under SWITCHBOARD_HOME, tables owned per package."""

from .db import DB_FILENAME, Migration, MigrationError, Store, StoreError, open_store

__all__ = ["DB_FILENAME", "Migration", "MigrationError", "Store", "StoreError", "open_store"]
