"""Who is calling: user tokens (stored hashed) for people, one cluster key for nodes."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, replace
from typing import Callable

from gpud.store.base import TokenRecord

TOKEN_ID_CHARS = 12  # a token is named by the start of its hash: enough to tell tokens apart, useless to sign in

@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: a user (maybe an admin) or a node."""

    user: str
    admin: bool = False
    node: bool = False
    allow_root: bool = False
    checkpoint_job: str | None = None  # a task's checkpoint credential: records checkpoints of this job alone


def digest(token: str) -> str:
    """The SHA-256 of a token, as stored (the token itself is never kept)."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_id(token_digest: str) -> str:
    """The short name a token is listed and revoked by: the start of its hash."""
    return token_digest[:TOKEN_ID_CHARS]


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return "gpud_" + secrets.token_urlsafe(32)


class Auth:
    """Checks bearer credentials against the known token hashes and the cluster key."""

    def __init__(self, tokens: dict[str, TokenRecord], cluster_key: str) -> None:
        self.tokens = dict(tokens)
        self.cluster_key = cluster_key

    def user(self, header: str | None) -> Principal | None:
        """The user a bearer token belongs to, or None (unknown or revoked)."""
        token = _bearer(header)
        if token is None:
            return None
        found = self.tokens.get(digest(token))
        if found is None or found.revoked is not None:
            return None
        return Principal(found.user, found.admin, allow_root=found.allow_root)

    def active(self) -> list[TokenRecord]:
        """The tokens that are accepted, oldest first."""
        return sorted((t for t in self.tokens.values() if t.revoked is None), key=lambda t: (t.created, t.hash))

    def matching(self, prefix: str) -> list[TokenRecord]:
        """The active tokens whose hash starts with ``prefix``."""
        return [t for t in self.active() if t.hash.startswith(prefix)]

    def revoke(self, record: TokenRecord, when: float) -> TokenRecord:
        """Stop accepting the token (already stored as revoked); returns the revoked record."""
        revoked = replace(record, revoked=when)
        self.tokens[record.hash] = revoked
        return revoked

    def node(self, header: str | None) -> bool:
        """True when the header carries the cluster key."""
        token = _bearer(header)
        return token is not None and hmac.compare_digest(token.encode(), self.cluster_key.encode())

    def add(self, record: TokenRecord) -> None:
        """Know one more token (already stored)."""
        self.tokens[record.hash] = record


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    return _bearer(header)


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def read_or_create_secret(path: str, make: Callable[[], str]) -> tuple[str, bool]:
    """The secret in ``path`` (stripped), or a new one written there with mode 0600; True when created."""
    try:
        with open(path, encoding="utf-8") as f:
            value = f.read().strip()
            if os.fstat(f.fileno()).st_mode & 0o077:
                os.fchmod(f.fileno(), 0o600)
        if value:
            return value, False
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    value = make()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(value + "\n")
    os.chmod(path, 0o600)
    return value, True
