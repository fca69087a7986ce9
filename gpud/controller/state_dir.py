"""The controller's state directory: one controller at a time, and only the store of this cluster.

A store is the cluster's memory (jobs, tokens, the id sequence). A missing,
empty, damaged or foreign one must never quietly become a new, empty
cluster: the controller refuses to start and says how to restore a backup,
and only ``--init`` makes a new cluster. The cluster id is kept twice, in
the store's meta table and in ``cluster.id`` beside it, so a store from
another cluster copied in is told apart from this cluster's own backup.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import uuid
from dataclasses import dataclass
from typing import Any

from gpud.store.base import StoreVersionError
from gpud.store.sqlite import FILE_NAME, SQLiteStore

CLUSTER_ID_FILE = "cluster.id"
LOCK_FILE = "controller.lock"
META_KEY = "cluster_id"


class StateError(RuntimeError):
    """The state directory cannot be used as it is; the message says why and what to do."""


@dataclass(slots=True)
class OpenState:
    """An open, locked state directory: the store, this cluster's id, and the lock held while it runs."""

    store: Any  # SQLiteStore, or gpud.store.postgres.PostgresStore (gpud/controller/pg_state.py)
    cluster_id: str
    lock_fd: int

    def close(self) -> None:
        """Release the lock (the store is closed by its owner)."""
        os.close(self.lock_fd)


def restore_hint(state_dir: str, damaged: bool = False) -> str:
    """How to put a backup back, or start afresh: the end of every refusal."""
    path = os.path.join(state_dir, FILE_NAME)
    aside = (f"move {path} and its -wal and -shm files aside (keep them: sqlite3's .recover may save some of "
             f"it), then " if damaged else "")
    return (f"{aside}to restore a backup made with `gpud backup`, stop the controller, copy the backup to {path} "
            f"(removing {FILE_NAME}-wal and {FILE_NAME}-shm beside it) and start it again; to start a new, "
            f"empty cluster instead (every job and token is then forgotten, and nodes must be re-joined), "
            f"start it once with --init")


def lock(state_dir: str) -> int:
    """Hold the state directory's lock for as long as the returned fd is open; StateError when another holds it."""
    path = os.path.join(state_dir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StateError(f"another gpud controller (pid {holder}) is using the state directory {state_dir}; "
                         f"two controllers must never share one store") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def open_state(state_dir: str, *, init: bool, synchronous: str = "FULL") -> OpenState:
    """Lock the state directory and open its store, refusing one that is not this cluster's.

    With ``init`` a missing or empty store becomes a new cluster, and a
    store of another cluster is adopted as this one's.
    """
    if os.path.lexists(state_dir) and not os.path.isdir(state_dir):
        raise StateError(f"cannot use the state directory {state_dir}: it is {_kind(state_dir)}, not a directory")
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise StateError(f"cannot use the state directory {state_dir}: {exc.strerror or exc}") from None
    try:
        fd = lock(state_dir)
    except OSError as exc:
        raise StateError(f"cannot use the state directory {state_dir}: cannot write "
                         f"{os.path.join(state_dir, LOCK_FILE)}: {exc.strerror or exc}") from None
    try:
        store, cluster_id = _open_store(state_dir, init, synchronous)
    except BaseException:
        os.close(fd)
        raise
    return OpenState(store, cluster_id, fd)


def _open_store(state_dir: str, init: bool, synchronous: str) -> tuple[SQLiteStore, str]:
    path = os.path.join(state_dir, FILE_NAME)
    for part in (path, path + "-wal", path + "-shm"):
        if os.path.lexists(part) and not os.path.isfile(part):
            raise StateError(f"the store {part} is {_kind(part)}, not a file, so the controller cannot use it; "
                             f"move it aside (gpud never made it); then, {restore_hint(state_dir)}")
    try:
        recorded = _read_id(state_dir)
    except OSError as exc:
        raise StateError(f"cannot read {os.path.join(state_dir, CLUSTER_ID_FILE)}: {exc.strerror or exc}") from None
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        size = -1
    if size <= 0 and not init:
        what = "is empty (zero bytes)" if size == 0 else "does not exist"
        first = "" if recorded else " If this is a new cluster, start the controller once with --init."
        raise StateError(f"the store {path} {what}, so the controller will not start as a new, empty cluster.{first}"
                         f" Otherwise, {restore_hint(state_dir)}")
    try:
        store = SQLiteStore(state_dir, synchronous=synchronous)
    except OSError as exc:
        raise StateError(f"cannot open the store {path}: {exc.strerror or exc}") from None
    except sqlite3.OperationalError as exc:  # not damage: a read-only file or filesystem, a full disk
        raise StateError(f"cannot open the store {path} for writing: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise StateError(f"the store {path} is damaged ({exc}); {restore_hint(state_dir, damaged=True)}") from None
    except StoreVersionError as exc:
        raise StateError(str(exc)) from None
    try:
        stored = store.meta_value(META_KEY)
        populated = store.populated()
    except sqlite3.DatabaseError as exc:
        store.close()
        raise StateError(f"the store {path} is damaged ({exc}); {restore_hint(state_dir, damaged=True)}") from None
    try:
        cluster_id = _settle_id(state_dir, store, stored, recorded, populated, init)
    except BaseException:
        store.close()
        raise
    return store, cluster_id


def _settle_id(state_dir: str, store: SQLiteStore, stored: str | None, recorded: str | None, populated: bool,
               init: bool) -> str:
    """This cluster's id, checked against the store's (or recorded in both when it is new)."""
    path = store.path
    if stored is None and not populated and not init:
        raise StateError(f"the store {path} holds no cluster (no jobs, no tokens, no cluster id), so the controller "
                         f"will not start as a new, empty cluster. {restore_hint(state_dir)}")
    if stored is not None and recorded is not None and stored != recorded and not init:
        raise StateError(f"the store {path} belongs to another cluster ({stored}), not to this one ({recorded}, "
                         f"recorded in {os.path.join(state_dir, CLUSTER_ID_FILE)}); {restore_hint(state_dir)} "
                         f"(--init adopts the store found here as this cluster's)")
    # A store written before cluster ids were recorded keeps its jobs and tokens and gets one now.
    cluster_id = stored or str(uuid.uuid4())
    if stored is None:
        store.set_meta(META_KEY, cluster_id)
    if recorded != cluster_id:
        _write_id(state_dir, cluster_id)
    return cluster_id


def _kind(path: str) -> str:
    """What is at ``path``, in words: "a directory", "a symbolic link", "a special file"."""
    if os.path.isdir(path):
        return "a directory"
    if os.path.islink(path):
        return "a symbolic link to nothing"
    return "a special file (a socket, a FIFO or a device)"


def _read_id(state_dir: str) -> str | None:
    try:
        with open(os.path.join(state_dir, CLUSTER_ID_FILE), encoding="utf-8") as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def _write_id(state_dir: str, cluster_id: str) -> None:
    path = os.path.join(state_dir, CLUSTER_ID_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(cluster_id + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def backup(state_dir: str, dest: str) -> dict[str, int]:
    """Copy the store to ``dest`` (mode 0600) with SQLite's online backup, consistent while the controller runs.

    Returns what the copy holds (jobs, tokens in force: revoked ones are kept but not counted). Refuses to overwrite ``dest``.
    """
    path = os.path.join(state_dir, FILE_NAME)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        raise StateError(f"there is no store to back up at {path}")
    if os.path.lexists(dest):
        raise StateError(f"{dest} already exists; give a new file name (a backup never overwrites a file)")
    tmp = f"{dest}.{os.getpid()}.tmp"
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise StateError(f"cannot write {dest}: {exc.strerror or exc}") from None
    try:
        source = sqlite3.connect(path)
        try:
            target = sqlite3.connect(tmp)
            try:
                source.execute("PRAGMA busy_timeout=5000")
                source.backup(target)
                target.execute("PRAGMA journal_mode=DELETE")
                (check,) = target.execute("PRAGMA integrity_check").fetchone()
                if check != "ok":
                    raise StateError(f"the copy of {path} failed its integrity check: {check}")
                counts = {"jobs": target.execute("SELECT COUNT(*) FROM jobs").fetchone()[0],
                          "tokens": target.execute("SELECT COUNT(*) FROM tokens WHERE revoked IS NULL").fetchone()[0]}
            finally:
                target.close()
        finally:
            source.close()
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except sqlite3.DatabaseError as exc:
        raise StateError(f"cannot back up {path}: {exc}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return counts
