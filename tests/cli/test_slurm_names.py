"""A Slurm partition or QOS in a submission: the pool and priority class it means, and the note the client shows."""

from __future__ import annotations

import tomllib

import pytest

from gpud.errors import ConfigError
from gpud.policy_file import parse_policy
from gpud.submission import Capacity, SubmitError, admit, read_job

POLICY_TOML = """
[[node_pools]]
name = "default"

[[node_pools]]
name = "h100"

[partitions]
gpu = "default"
big = "h100"

[[projects]]
name = "vision"
"""


@pytest.fixture(scope="module")
def policy():
    return parse_policy(tomllib.loads(POLICY_TOML), "policy.toml")


def submit(policy, **fields):
    payload = {"project": "vision", "command": ["true"], "workdir": "/tmp", **fields}
    return admit(read_job(payload), user="ann", admin=False, policy=policy, capacity=Capacity())


@pytest.mark.parametrize("partition, pool, how", [
    ("h100", "h100", "pool"),          # the name of a pool
    ("big", "h100", "mapped"),         # mapped by [partitions]
    ("gpu", "default", "mapped"),
    ("debug", "default", "default"),   # neither: the default pool, never a refusal
])
def test_a_partition_becomes_a_pool(policy, partition, pool, how):
    submission = submit(policy, partition=partition)
    assert submission.job.pool == pool
    assert submission.notes == ({"field": "partition", "given": partition, "how": how, "pool": pool},)


def test_an_explicit_pool_wins_over_the_partition(policy):
    submission = submit(policy, partition="big", pool="default")
    assert submission.job.pool == "default"
    assert submission.notes[0]["how"] == "overridden"


def test_a_qos_that_is_a_priority_class_sets_it(policy):
    submission = submit(policy, qos="inference")
    assert (submission.job.priority_class, submission.job.priority) == ("inference", 125)
    assert submission.notes == ({"field": "qos", "given": "inference", "how": "class"},)


def test_an_unknown_qos_is_noted_and_changes_nothing(policy):
    submission = submit(policy, qos="normal")
    assert submission.job.priority_class == "train"
    assert submission.notes == ({"field": "qos", "given": "normal", "how": "ignored"},)


def test_a_qos_is_still_subject_to_who_may_use_the_class(policy):
    limited = parse_policy(tomllib.loads(POLICY_TOML.replace('name = "vision"', 'name = "vision"\n'
                                                                                 'priorities = ["train"]')),
                           "policy.toml")
    with pytest.raises(SubmitError):
        submit(limited, qos="inference")


def test_a_partition_that_is_not_a_name_is_refused(policy):
    with pytest.raises(SubmitError, match="partition must be a partition name"):
        submit(policy, partition=7)
    with pytest.raises(SubmitError, match="qos must be a QOS name") as refused:
        submit(policy, qos="")
    assert refused.value.field == "qos" and refused.value.status == 422
    with pytest.raises(SubmitError, match="partition must be a partition name") as refused:
        submit(policy, partition="")
    assert refused.value.field == "partition"


def test_the_partitions_table_must_name_known_pools():
    with pytest.raises(ConfigError, match='partitions.big: unknown node pool "h200"; did you mean "h100"'):
        parse_policy(tomllib.loads(POLICY_TOML.replace('big = "h100"', 'big = "h200"')), "policy.toml")
    with pytest.raises(ConfigError):
        parse_policy(tomllib.loads('[partitions]\ngpu = 3\n[[projects]]\nname = "v"\n'), "policy.toml")


def test_without_pools_a_partition_maps_only_to_the_default_pool():
    policy = parse_policy(tomllib.loads('[partitions]\ngpu = "default"\n[[projects]]\nname = "vision"\n'),
                          "policy.toml")
    assert policy.partitions == {"gpu": "default"}
