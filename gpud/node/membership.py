"""Which cluster a node belongs to: the controller's cluster id, remembered at the first registration.

A node never takes orders from a controller of another cluster (a
controller started afresh with --init, or pointed at the wrong store): its
tasks would be treated as strangers there and stopped.
"""

from __future__ import annotations

import os

CLUSTER_ID_FILE = "cluster.id"


def remembered(state_dir: str) -> str | None:
    """The cluster id this node has registered with before, or None for a node that never has."""
    try:
        with open(os.path.join(state_dir, CLUSTER_ID_FILE), encoding="utf-8") as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def remember(state_dir: str, cluster_id: str) -> None:
    """Record the cluster id (written whole, then renamed into place)."""
    path = os.path.join(state_dir, CLUSTER_ID_FILE)
    os.makedirs(state_dir, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(cluster_id + "\n")
    os.replace(tmp, path)


def refusal(state_dir: str, answer: dict) -> str | None:
    """Why the controller that sent ``answer`` (its ``registered`` message) is refused, or None when it is ours.

    The first controller with a cluster id is remembered as this node's.
    """
    theirs = answer.get("cluster_id")
    if not isinstance(theirs, str) or not theirs:
        return None  # a controller that predates cluster ids
    ours = remembered(state_dir)
    if ours is None:
        remember(state_dir, theirs)
        return None
    if theirs != ours:
        return (f"the controller belongs to cluster {theirs}, but this node belongs to cluster {ours}; it takes "
                f"no orders from it. If the cluster was made anew on purpose (gpud controller --init), remove "
                f"{os.path.join(state_dir, CLUSTER_ID_FILE)} once this node's tasks have ended, and restart the node")
    return None
