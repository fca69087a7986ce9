"""Durable state: the store interface the controller writes through, with SQLite and PostgreSQL behind it."""

from gpud.store.base import SCHEMA_VERSION, Event, Fenced, Loaded, Store, StoreVersionError, TokenRecord, WriteBatch

__all__ = ["SCHEMA_VERSION", "StoreVersionError", "Event", "Fenced", "Loaded", "Store", "TokenRecord", "WriteBatch"]
