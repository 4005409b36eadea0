"""The shared SQLite store: one database file under SWITCHBOARD_HOME, tables owned per package."""

from common.store.db import DB_FILENAME, Busy, Migration, Store, open_store
from common.store.errors import MigrationError, StoreError
from common.store.health import check_store

__all__ = ["DB_FILENAME", "Busy", "Migration", "MigrationError", "Store", "StoreError", "check_store", "open_store"]
