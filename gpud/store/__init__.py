"""Durable state: the store interface the controller writes through, and its SQLite implementation."""

from gpud.store.base import Event, Loaded, Store, WriteBatch

__all__ = ["Event", "Loaded", "Store", "WriteBatch"]
