"""The node's lease: how long its tasks may run without the controller hearing from the node.

The controller grants a lease of ``lease_s`` seconds with every answer to
a heartbeat (and with ``registered``); the daemon counts it from the moment
it sent the heartbeat that was answered, so its lease always runs out no
later than the controller's view of it. The daemon writes the lease to a
file in the run directory; every task supervisor reads that file and, once
the lease has run out (the daemon stopped, hung or cut off from the
controller), stops its tasks: the stop signal, then SIGKILL at the lease's
end plus ``grace_s`` (at once, for a supervisor that got to run later than
that). The controller requeues a silent node's jobs only after the lease
plus that grace period (and a margin), so no job runs twice at once.

Times are on the host's monotonic clock, which every process of the host
shares; the boot id guards against a lease written before a reboot.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from gpud import jsontext
from gpud.node.taskstate import write_json

LEASE_FILE = "lease.json"
CHECK_S = 0.25  # how often a supervisor with tasks looks at the lease
FENCED_REASON = "node lease expired"  # a task's exit reason when the lease stopped it


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


BOOT_ID = _boot_id()


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease held until ``expires`` (``time.monotonic()``), whose tasks get ``grace_s`` to stop after it."""

    expires: float
    lease_s: float
    grace_s: float

    def expired(self, now: float | None = None) -> bool:
        """True once the lease has run out."""
        return (time.monotonic() if now is None else now) >= self.expires


def lease_path(run_root: str) -> str:
    """The lease file of the node whose run directory is ``run_root``."""
    return os.path.join(run_root, LEASE_FILE)


def write_lease(path: str, lease: Lease) -> None:
    """Record ``lease`` atomically, readable by root alone."""
    write_json(path, {"expires": lease.expires, "lease_s": lease.lease_s, "grace_s": lease.grace_s,
                      "boot_id": BOOT_ID})


def read_lease(path: str) -> Lease | None:
    """The recorded lease; None when there is none (no lease is enforced).

    A lease written before the host's last reboot, or unreadable, reads as
    one that has run out: a supervisor must never run on a lease it cannot trust.
    """
    try:
        with open(path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return Lease(0.0, 0.0, 0.0)
    try:
        data = jsontext.loads(text)
        if data.get("boot_id", BOOT_ID) != BOOT_ID:
            return Lease(0.0, float(data["lease_s"]), float(data["grace_s"]))
        return Lease(float(data["expires"]), float(data["lease_s"]), float(data["grace_s"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return Lease(0.0, 0.0, 0.0)


def drop_lease(path: str) -> None:
    """Stop enforcing any lease (the controller grants none)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
