"""What the controller needs from a durable store, small enough that PostgreSQL can implement it too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


# The version of the tables every backend writes (meta key ``schema_version``); a store written by a later
# gpud, with a higher version, is refused rather than misread.
SCHEMA_VERSION = 1


class StoreVersionError(RuntimeError):
    """The store was written by a newer gpud than this one; the message says so."""


class Fenced(RuntimeError):
    """Another controller took the lease: this one's term is over, and the write was refused whole."""

    def __init__(self, mine: int, current: int | None) -> None:
        super().__init__(f"this controller's term {mine} is over (the lease is now at term {current}); "
                         f"another controller leads, and nothing of this write was stored")
        self.mine = mine
        self.current = current


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened, for ``gpuctl show`` and for accounting: one line about one job or node."""

    time: float
    kind: str
    message: str
    job: str | None = None
    node: str | None = None


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A user's token as stored: its SHA-256 (never the token), whose it is, and what it may do.

    ``allow_root`` lets the token's jobs run as uid 0; ``revoked`` is when
    an admin revoked it (a revoked token is kept, for the record, but never
    accepted again).
    """

    hash: str
    user: str
    admin: bool
    created: float
    allow_root: bool = False
    revoked: float | None = None


@dataclass(slots=True)
class WriteBatch:
    """Changes written together in one transaction: all of them are durable, or none.

    ``jobs`` holds (id, seq, state, user, project, submitted, ended, record JSON) rows.
    """

    jobs: list[tuple[str, int, str, str, str, float, float | None, str]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    nodes: list[tuple[str, str]] = field(default_factory=list)
    tokens: list[TokenRecord] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)
    # (user, key, request fingerprint, status, answer JSON, time) of idempotent requests
    answers: list[tuple[str, str, str, int, str, float]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.jobs or self.events or self.nodes or self.tokens or self.meta or self.answers)


@dataclass(slots=True)
class Loaded:
    """What a restarted controller reads back: active jobs, nodes, tokens (revoked ones too), settings, the highest
    job seq."""

    jobs: list[str]
    nodes: dict[str, str]
    tokens: dict[str, TokenRecord]
    meta: dict[str, str]
    last_seq: int = 0


class Store(Protocol):
    """A durable store; calls block and are made from one thread at a time."""

    def load(self) -> Loaded:
        """Everything a restarted controller needs: jobs not finished (their JSON records), nodes, tokens, meta,
        and the highest seq of any job stored, finished or not."""

    def write(self, batch: WriteBatch) -> None:
        """Write the batch in one transaction; durable when this returns."""

    def job(self, job_id: str) -> str | None:
        """One job's JSON record, finished or not; None when unknown."""

    def array_jobs(self, array_id: str) -> list[str]:
        """The JSON records of every element of an array, finished or not; empty when there is no such array."""

    def array_states(self, array_id: str) -> dict[str, int]:
        """How many elements of an array are stored in each state."""

    def jobs_state(self, job_ids: list[str]) -> dict[str, str]:
        """The state of each of these jobs the store knows."""

    def history(self, *, since: float | None, user: str | None, project: str | None,
                limit: int) -> list[str]:
        """Finished jobs' JSON records, most recently ended first."""

    def events(self, job_id: str, limit: int = 200) -> list[Event]:
        """The events of one job, oldest first."""

    def answer(self, user: str, key: str) -> tuple[str, int, str] | None:
        """The stored answer to ``user``'s idempotent request ``key``: (fingerprint, status, answer JSON)."""

    def forget_answers(self, before: float) -> int:
        """Delete the answers to idempotent requests made before ``before``; returns how many."""

    def usage(self, synchronous: str = "FULL") -> Any:
        """The decayed-usage tables of this store (load, save, ended_between, close), on their own connection."""

    def close(self) -> None:
        """Release the store's files or connections."""


def query_args(**kwargs: Any) -> dict[str, Any]:
    """The keyword arguments with None values dropped."""
    return {key: value for key, value in kwargs.items() if value is not None}
