"""Errors gpud reports to people: each names what is wrong and where."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration, policy or scenario file that cannot be used.

    The message names the file, the table and the key (and the line for
    syntax errors), so the person who wrote it can fix it without guessing.
    """

    def __init__(self, source: str, where: str, message: str) -> None:
        self.source = source
        self.where = where
        self.detail = message
        # Where the mistake sits in the parsed data: (table, key) or (array, index); None when unknown.
        # Set by gpud.tomlcheck, so that a check can set the mistake aside and go on to the next one.
        self.spot: tuple | None = None
        location = f"{source}: {where}" if where else source
        super().__init__(f"{location}: {message}")
