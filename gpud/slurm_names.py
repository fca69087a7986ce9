"""A Slurm partition or QOS named in a submission, resolved into the node pool and priority class it means.

Slurm scripts almost always name a partition (``#SBATCH -p gpu``) and often a
QOS; the names are a cluster's own, so a job is not refused for them. What
was done with each name travels back as a note (data) for the client to show.
"""

from __future__ import annotations

from dataclasses import replace

from gpud.policy import Policy
from gpud.wire.fields import WireError
from gpud.wire.job import JobRequest

# The ways a name can be taken, as the notes' "how".
POOL = "pool"                # the partition is the name of a pool
MAPPED = "mapped"            # the policy's [partitions] table maps it to a pool
DEFAULT = "default"          # neither: the job goes to the default pool
CLASS = "class"              # the QOS is the name of a priority class
IGNORED = "ignored"          # the QOS names no priority class: the job keeps its own priority
OVERRIDDEN = "overridden"    # the job also gave the pool (or priority) itself, which wins


def resolve(request: JobRequest, policy: Policy) -> tuple[JobRequest, list[dict[str, str]]]:
    """``request`` with ``partition`` and ``qos`` replaced by ``pool`` and ``priority``, and a note on each.

    A partition is a pool of that name, else the pool the policy's
    ``[partitions]`` table maps it to, else the default pool. A QOS that is a
    priority class becomes the job's priority. An explicit ``pool`` or
    ``priority`` in the request wins. An empty partition or QOS raises WireError naming it.
    """
    notes: list[dict[str, str]] = []
    pool, priority = request.pool, request.priority
    partition, qos = request.partition, request.qos
    if partition == "":
        raise WireError("partition must be a partition name", "partition")
    if qos == "":
        raise WireError("qos must be a QOS name", "qos")
    if partition is not None:
        pool, how = _pool_of(partition, policy)
        if request.pool is not None:
            pool, how = request.pool, OVERRIDDEN
        notes.append({"field": "partition", "given": partition, "how": how, "pool": pool})
    if qos is not None:
        if request.priority is not None:
            how = OVERRIDDEN
        elif qos in policy.priority_classes:
            priority, how = qos, CLASS
        else:
            how = IGNORED
        notes.append({"field": "qos", "given": qos, "how": how})
    return replace(request, pool=pool, priority=priority, partition=None, qos=None), notes


def _pool_of(partition: str, policy: Policy) -> tuple[str, str]:
    if partition in policy.pools or partition == policy.default_pool:
        return partition, POOL
    if partition in policy.partitions:
        return policy.partitions[partition], MAPPED
    return policy.default_pool, DEFAULT
