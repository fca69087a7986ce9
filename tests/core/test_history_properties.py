"""Fair share with history over random clusters of every job shape (hypothesis).

Past usage only scales how the surplus over quotas is divided: a queue
still deserves its quota however much it used, and strength 0 (or history
off) gives exactly the plans of a policy that never heard of history.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, strategies as st

from gpud.core import schedule
from gpud.model import Plan, Snapshot
from gpud.policy import FairShare, Policy

from test_properties import PM, POOL, SETTINGS, TOL, Case, cases


@st.composite
def usages(draw, policy: Policy) -> dict[tuple[str, str, str], float]:
    """Decayed GPU-seconds for some of the policy's departments and projects (and users), often lopsided."""
    usage: dict[tuple[str, str, str], float] = {}
    for level, names in (("department", policy.departments), ("project", policy.projects)):
        for name in names:
            if draw(st.booleans()):
                usage[(level, POOL, name)] = float(draw(st.sampled_from([0, 1, 100, 3600, 10 ** 6, 10 ** 9])))
    for project in policy.projects:
        for user in ("alice", "bob"):
            if draw(st.booleans()):
                usage[("user", POOL, f"{project}/{user}")] = float(draw(st.integers(0, 10 ** 6)))
    return usage


@st.composite
def with_history(draw) -> tuple[Case, dict[tuple[str, str, str], float]]:
    """A random case, its jobs given users, and random past usage."""
    case = draw(cases())
    jobs = tuple(dataclasses.replace(job, user=draw(st.sampled_from(["", "alice", "bob"])))
                 for job in case.snapshot.jobs)
    snapshot = dataclasses.replace(case.snapshot, jobs=jobs)
    return dataclasses.replace(case, snapshot=snapshot), draw(usages(case.policy))


def _plan(policy: Policy, snapshot: Snapshot, fair_share: FairShare,
          usage: dict[tuple[str, str, str], float]) -> Plan:
    return schedule(dataclasses.replace(snapshot, usage=usage),
                    dataclasses.replace(policy, fair_share=fair_share), PM)


def _same(a: Plan, b: Plan) -> None:
    assert a.binds == b.binds
    assert a.evictions == b.evictions
    assert dict(a.pending) == dict(b.pending)
    assert a.queues == b.queues


@SETTINGS
@given(with_history(), st.sampled_from([0.5, 1.0, 3.0, 100.0]), st.sampled_from([0.0, 600.0]))
def test_history_never_takes_a_guaranteed_quota(drawn, strength, penalty):
    """However much a queue used, its fair share with history is at least the part of its quota it
    deserves without history (its quota, capped by what it may take): only the surplus moves."""
    case, usage = drawn
    plan = _plan(case.policy, case.snapshot, FairShare(history=True, strength=strength, entry_penalty_s=penalty),
                 usage)
    before = {(q.kind, q.name): q for q in schedule(case.snapshot, case.policy, PM).queues}
    for queue in plan.queues:
        then = before[(queue.kind, queue.name)]
        for resource in ("gpu", "cpu", "memory"):
            guaranteed = min(queue.quota.get(resource), then.fair_share.get(resource))
            assert queue.fair_share.get(resource) >= guaranteed - TOL, (queue, resource, guaranteed)


@SETTINGS
@given(with_history(), st.sampled_from([0.0, 600.0]), st.booleans())
def test_strength_zero_or_history_off_plans_as_without_history(drawn, penalty, user_order):
    """History at strength 0, or off at any strength, plans exactly as a policy without history; with
    the user order off too, exactly as before users and usage existed."""
    case, usage = drawn
    base = _plan(case.policy, case.snapshot, FairShare(entry_penalty_s=penalty, user_order=user_order), usage)
    _same(_plan(case.policy, case.snapshot, FairShare(history=True, strength=0.0, entry_penalty_s=penalty,
                                                      user_order=user_order), usage), base)
    _same(_plan(case.policy, case.snapshot, FairShare(history=False, strength=5.0, entry_penalty_s=penalty,
                                                      user_order=user_order), usage), base)
    if not user_order:
        anonymous = dataclasses.replace(case.snapshot, jobs=tuple(dataclasses.replace(job, user="")
                                                                 for job in case.snapshot.jobs))
        _same(base, _plan(case.policy, anonymous, FairShare(user_order=False), {}))
        _same(base, _plan(case.policy, anonymous, FairShare(), {}))  # one user: the user order changes nothing
