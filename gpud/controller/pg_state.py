"""A controller's state in PostgreSQL: the cluster's id and key live in the database, shared by every controller.

The state directory still holds this controller's lock and, after
``--init``, the admin token and a copy of the cluster key (mode 0600), as
with SQLite. A database without gpud's tables, or without a cluster id, is
refused unless ``--init`` is given: that is done once per cluster, and any
later ``--init`` finds the cluster and changes nothing.
"""

from __future__ import annotations

import os
import uuid

from gpud.controller.auth import new_token, read_or_create_secret
from gpud.controller.state_dir import META_KEY, OpenState, StateError, lock
from gpud.store.base import StoreVersionError

KEY_META = "cluster_key"


def open_pg_state(url: str, state_dir: str, key_path: str, *, init: bool, holder: str) -> OpenState:
    """Lock the state directory and open the database at ``url``, refusing one that holds no cluster.

    With ``init`` the tables, the cluster id and the cluster key are made
    when missing (the key from ``key_path`` when that file exists, so nodes
    keep theirs), and the key is written to ``key_path`` when that is missing.
    """
    from gpud.store.postgres import PostgresStore, create_schema, driver, has_schema, problem, shown
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        fd = lock(state_dir)
    except OSError as exc:
        raise StateError(f"cannot use the state directory {state_dir}: {exc.strerror or exc}") from None
    try:
        psycopg = driver()
        try:
            if init:
                create_schema(url)
            elif not has_schema(url):
                raise StateError(f"the database {shown(url)} holds no gpud cluster (no gpud tables); start one "
                                 f"controller of the cluster once with --init, or move an existing cluster in with "
                                 f"`gpud store copy`")
            store = PostgresStore(url, name=f"gpud controller {holder}")
        except psycopg.Error as exc:
            raise StateError(f"cannot use the database {shown(url)}: {problem(exc, url)}") from None
        except StoreVersionError as exc:
            raise StateError(str(exc)) from None
        try:
            cluster_id = _settle(store, key_path, init)
        except BaseException:
            store.close()
            raise
    except BaseException:
        os.close(fd)
        raise
    return OpenState(store, cluster_id, fd)


def _settle(store, key_path: str, init: bool) -> str:
    """The cluster id (made with ``init`` when missing), and the cluster key in the database."""
    if init:
        with store.db.transaction():
            store.db.execute("INSERT INTO meta VALUES (%s, %s) ON CONFLICT (key) DO NOTHING",
                             (META_KEY, str(uuid.uuid4())))
            if store.meta_value(KEY_META) is None:
                key = _file_secret(key_path) or new_token()
                store.db.execute("INSERT INTO meta VALUES (%s, %s) ON CONFLICT (key) DO NOTHING", (KEY_META, key))
    cluster_id = store.meta_value(META_KEY)
    key = store.meta_value(KEY_META)
    if cluster_id is None or key is None:
        raise StateError(f"the database {store.path} holds no gpud cluster (no cluster id or key); start one "
                         f"controller of the cluster once with --init")
    if init:
        read_or_create_secret(key_path, lambda: key)
    return cluster_id


def _file_secret(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None
