"""A learnt blocker restated once per failure and request, over random clusters of every job shape (hypothesis).

Allocation and preemption pass over groups whose next job an earlier
failure blocks, and tell each the failure's blocker in its own terms
(``restate_learnt``). Where the user order sorts a project, each request
has a group per user, and the recorder restates a failure once for all of
them (``ReasonRecorder.restated``). Worked out anew for every group and
job, cycle after cycle of binds, evictions and moves, the plans and every
pending reason must come out the same.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, strategies as st

from gpud.core.recorder import ReasonRecorder, restate_learnt
from gpud.model import JobSpec, Snapshot

from test_properties import NOW, SETTINGS, Case, assert_plans_unchanged_with, python_core_only, requests
from test_user_order_merge import USERS, with_users


@st.composite
def many_of_few_requests(draw) -> Case:
    """A random cluster (``with_users``: every job shape, several users per project) with a long queue
    of pending jobs of a few requests more: many groups of one request, one per user, that allocation
    and preemption pass over after one of them failed."""
    case = draw(with_users())
    shapes = draw(st.lists(st.tuples(requests(), st.integers(1, 3)), min_size=1, max_size=3))
    projects = sorted(case.policy.projects)
    jobs = list(case.snapshot.jobs)
    for seq in range(len(jobs), len(jobs) + draw(st.integers(6, 30))):
        request, tasks = draw(st.sampled_from(shapes))
        minimum = draw(st.one_of(st.none(), st.integers(1, tasks)))
        jobs.append(JobSpec(id=f"j{seq}", project=draw(st.sampled_from(projects)), request=request,
                            priority=draw(st.sampled_from([50, 75, 100, 125])), tasks=tasks, min_tasks=minimum,
                            submitted=float(draw(st.integers(0, int(NOW)))), seq=seq, placements=(None,) * tasks,
                            user=draw(st.sampled_from(USERS))))
    return dataclasses.replace(case, snapshot=Snapshot(case.snapshot.nodes, tuple(jobs), case.snapshot.now,
                                                       case.snapshot.usage))


def _restated_afresh(self, failure, sid, job, tasks):
    """``ReasonRecorder.restated`` undone: the blocker restated for every job asked about."""
    return restate_learnt(self.state, job, tasks, failure.blocker, None)


@python_core_only
@SETTINGS
@given(many_of_few_requests())
def test_a_blocker_restated_afresh_for_every_group_gives_the_same_plans_and_reasons(case):
    assert_plans_unchanged_with(case, ReasonRecorder, "restated", _restated_afresh)
