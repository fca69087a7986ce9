"""Who a job runs as: the token's user, never uid 0 unless the token was made with allow-root.

The node daemon has the last word (it looks the user up where the job
runs); the controller refuses at submit what it can already tell is wrong
from its own host's accounts.
"""

from __future__ import annotations

import pwd
import time

from gpud.controller.auth import Principal

CACHE_S = 30.0  # how long an account lookup is reused, as nscd would
_accounts: dict[str, tuple[float, int | None]] = {}


def uid_of(user: str) -> int | None:
    """The uid of ``user`` on this host, or None when there is no such account (cached for CACHE_S)."""
    now = time.monotonic()
    cached = _accounts.get(user)
    if cached is not None and cached[0] > now:
        return cached[1]
    try:
        uid: int | None = pwd.getpwnam(user).pw_uid
    except (KeyError, ValueError, UnicodeEncodeError):
        uid = None
    _accounts[user] = (now + CACHE_S, uid)
    return uid


def refusal(principal: Principal, *, local_node: bool) -> str | None:
    """Why this caller's jobs cannot run, as far as this host can tell; None when nothing is known against them.

    A user who is uid 0 here is refused unless the token allows root. When
    the jobs run on this very host (``local_node``), a user with no account
    here is refused too.
    """
    uid = uid_of(principal.user)
    if uid == 0 and not principal.allow_root:
        return (f"user {principal.user!r} is uid 0, and jobs run as root only for a token created with "
                f"--allow-root (gpuctl token create --user {principal.user} --allow-root)")
    if uid is None and local_node:
        return f"user {principal.user!r} has no account on this host, where its jobs would run"
    return None
