"""Signed session cookies and the CSRF tokens of the dashboard's forms.

A session cookie names the token its user signed in with by the token's
hash (never the token), a random nonce and an expiry, signed with HMAC-SHA256
under a key kept in the controller's state directory. The token is looked up
on every request, so revoking it ends its sessions at once. A form's CSRF
token is the HMAC of the session's nonce: it cannot be made without the key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass

from gpud.controller.auth import read_or_create_secret

KEY_FILE = "ui.key"
SESSION_COOKIE = "gpud_session"
LOGIN_COOKIE = "gpud_login"     # the nonce the sign-in form's CSRF token is made from
SESSION_S = 12 * 3600.0


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in browser: the hash of the token it signed in with, its nonce and when it expires."""

    token_hash: str
    nonce: str
    expires: float


class Signer:
    """Signs and checks session cookies and CSRF tokens with one secret key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def from_state_dir(cls, state_dir: str) -> Signer:
        """The signer whose key is ``ui.key`` in the state directory, made (mode 0600) on first use."""
        key, _ = read_or_create_secret(os.path.join(state_dir, KEY_FILE), lambda: secrets.token_urlsafe(32))
        return cls(key.encode())

    def _mac(self, text: str) -> str:
        digest = hmac.new(self._key, text.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def new_session(self, token_hash: str, now: float, lifetime_s: float = SESSION_S) -> tuple[str, Session]:
        """A fresh session for the token with this hash, and the cookie value that carries it."""
        session = Session(token_hash, secrets.token_urlsafe(16), float(int(now + lifetime_s)))
        payload = f"{session.token_hash}:{session.nonce}:{int(session.expires)}"
        return f"{payload}.{self._mac('session:' + payload)}", session

    def session(self, cookie: str | None, now: float) -> Session | None:
        """The session a cookie carries; None when it is missing, forged, malformed or expired."""
        if not cookie:
            return None
        payload, _, mac = cookie.rpartition(".")
        if not payload or not hmac.compare_digest(mac, self._mac("session:" + payload)):
            return None
        parts = payload.split(":")
        if len(parts) != 3 or not parts[2].isdigit():
            return None
        session = Session(parts[0], parts[1], float(parts[2]))
        return session if session.expires > now else None

    def csrf(self, nonce: str) -> str:
        """The CSRF token of the forms shown to the holder of ``nonce``."""
        return self._mac("csrf:" + nonce)

    def csrf_ok(self, nonce: str, given: str | None) -> bool:
        """Whether ``given`` is the CSRF token for ``nonce`` (compared in constant time)."""
        return bool(nonce) and given is not None and hmac.compare_digest(given, self.csrf(nonce))
