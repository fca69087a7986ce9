"""Durable state: the store interface the controller writes through, and its SQLite implementation."""

from gpud.store.base import Event, Loaded, Store, TokenRecord, WriteBatch

__all__ = ["Event", "Loaded", "Store", "TokenRecord", "WriteBatch"]
