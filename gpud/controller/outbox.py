"""The commands for nodes that the cluster's changes made, held until those changes are durable."""

from __future__ import annotations

from collections import defaultdict


class Outbox:
    """Commands piled up per node; the controller takes them after a commit and sends them in order."""

    def __init__(self) -> None:
        self.pending: dict[str, list[dict]] = defaultdict(list)
        self.made = 0  # commands put here so far: whoever made some commits to send them

    def put(self, node: str, message: dict) -> None:
        """Add a command for ``node`` after those already waiting for it."""
        self.pending[node].append(message)
        self.made += 1

    def take(self) -> dict[str, list[dict]]:
        """The commands piled up for each node since the last call, in the order they were made."""
        commands, self.pending = self.pending, defaultdict(list)
        return commands

    def put_back(self, commands: dict[str, list[dict]]) -> None:
        """Return commands taken but not sent, ahead of those piled up since."""
        for node, messages in commands.items():
            self.pending[node][:0] = messages
