"""The queue walk's merge of the users' runs, over random clusters of every job shape (hypothesis).

Where the user order sorts a project, the walk keeps each user's groups
apart and takes from the user found first, comparing the users again only
once that user's next group no longer comes before the others' first, or
after a bind or a release (``QueueWalk._lead``). The order it takes jobs in
must be the user order worked out from scratch, and comparing every user
at every step, by their standing at that moment, must give the very same
plans, cycle after cycle.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, strategies as st

from gpud.core import COMPILED
from gpud.core.placement import Placer
from gpud.core.queue_walk import QueueWalk, Skip
from gpud.core.state import ClusterState, Statement
from gpud.model import JobSpec, NodeSpec, Resources, Snapshot, TaskPlacement, TaskRequest
from gpud.policy import Department, FairShare, Policy, Project

from test_properties import NOW, PM, POOL, SETTINGS, Case, assert_plans_unchanged_with, cases, python_core_only

USERS = ("alice", "bob", "carol", "dave")
WINDOW = 600.0


@st.composite
def with_users(draw) -> Case:
    """A random cluster (every job shape: single tasks, gangs, elastic gangs, fractions, memory slices,
    CPU-only, departments) whose jobs belong to random users with random past usage."""
    case = draw(cases())
    jobs = tuple(dataclasses.replace(job, user=draw(st.sampled_from(USERS))) for job in case.snapshot.jobs)
    usage = {("user", POOL, f"{project}/{user}"): float(draw(st.sampled_from([0, 300, 600, 5000])))
             for project in case.policy.projects for user in USERS if draw(st.booleans())}
    policy = dataclasses.replace(case.policy, fair_share=dataclasses.replace(case.policy.fair_share,
                                                                            entry_penalty_s=WINDOW))
    return Case(policy, Snapshot(case.snapshot.nodes, jobs, case.snapshot.now, usage), case.cycles)


def _every_user_compared(self, cursor):
    """``QueueWalk._lead`` undone: every user's next group compared at every step, by its standing then."""
    return self._choose(cursor)


@python_core_only
@SETTINGS
@given(with_users())
def test_comparing_every_user_at_every_step_gives_the_same_plans(case):
    # The user found first stays first, at one comparison a group, until its next group no longer comes
    # before the others' first or a bind or release changes a standing. Comparing every user's next group
    # at every step, cycle after cycle of binds, evictions and moves, must give the very same plans.
    assert_plans_unchanged_with(case, QueueWalk, "_lead", _every_user_compared)


class _HeldGroups(Skip):
    """Passes over the groups whose first job's id ends in one of ``digits``."""

    def __init__(self, digits: str) -> None:
        self.digits = digits

    def holds(self, job, queue, group=None) -> bool:
        return group is not None and self.passes_over(group)

    def passes_over(self, group) -> bool:
        """True for a group this Skip passes over."""
        return group.jobs[0].id[-1] in self.digits


# A compiled core's Skip takes no subclass of the tests' own: there the walk passes over nothing.
DIGITS = [""] if COMPILED else ["", "1", "02", "13579"]


@SETTINGS
@given(with_users(), st.sampled_from(DIGITS))
def test_the_walk_takes_each_projects_jobs_in_the_user_order_worked_out_from_scratch(case, digits):
    # With nothing placed during the walk, every user keeps its standing: each project's jobs come by
    # priority, then their user's usage plus the window times the GPUs it holds, then those GPUs, then the
    # job order. Once a project's first job is taken, its groups the Skip holds for give no more jobs.
    state = ClusterState(case.snapshot, case.policy, PM)
    state.begin_cycle()
    backlog = state.backlog
    skip = _HeldGroups(digits) if digits else None
    walk = QueueWalk(state, backlog)
    taken = []
    for job in walk:
        taken.append(job.id)
        if skip is not None:
            walk.pass_over(skip)
    order = backlog.order
    for queue, groups in backlog.by_queue.items():
        def user_key(job, queue=queue):
            held = state.users_gpus(queue).get(job.user, 0.0)
            usage = state.usage.get(("user", queue.pool, f"{queue.name}/{job.user}"), 0.0)
            return (-job.priority, usage + WINDOW * held, held, order.key(job))
        waiting = sorted((job for group in groups.values() for job in group.jobs), key=user_key)
        expected = [job.id for i, job in enumerate(waiting)
                    if i == 0 or skip is None or not skip.passes_over(backlog.group_of[job.id])]
        mine = [job_id for job_id in taken if backlog.group_of[job_id].queue is queue]
        assert mine == expected, (queue.name, mine, expected)


@SETTINGS
@given(with_users(), st.randoms(use_true_random=False))
def test_each_job_taken_comes_first_in_the_user_order_of_that_moment(case, rng):
    # Jobs are placed as the walk goes (each taken job whose tasks all find room, or as the draw says), and
    # after most takes a running task of another user with jobs waiting stops, so the users' standings change
    # between takes: each job taken must come first among its project's jobs still waiting, by the user order
    # worked out from the standings at that moment.
    state = ClusterState(case.snapshot, case.policy, PM)
    state.begin_cycle()
    backlog, order, placer = state.backlog, state.backlog.order, Placer(state)
    statement = Statement(state)
    waiting = {job.id: job for group in backlog.group_of.values() for job in group.jobs}

    def user_key(job, queue):
        held = state.users_gpus(queue).get(job.user, 0.0)
        usage = state.usage.get(("user", queue.pool, f"{queue.name}/{job.user}"), 0.0)
        return (-job.priority, usage + WINDOW * held, held, order.key(job))

    for job in QueueWalk(state, backlog):
        queue = backlog.group_of[job.id].queue
        rivals = [other for other in waiting.values() if backlog.group_of[other.id].queue is queue]
        first = min(rivals, key=lambda other: user_key(other, queue))
        assert job.id == first.id, (queue.name, job.id, first.id)
        del waiting[job.id]
        if rng.random() < 0.8:  # a running task of another user with jobs waiting stops, as a preemption stops one
            users = {other.user for other in rivals if other.id in waiting} - {job.user}
            running = [(other, task) for other in state.running[queue].values()
                       if other.user in users and other.id not in state.touched
                       for task in state.running_tasks(other.id)]
            if running:
                other, task = rng.choice(running)
                statement.evict(other, task, "preempt", None, job.id)
        if rng.random() < 0.2:
            continue  # left waiting, as a job that failed is
        mark = statement.checkpoint()
        for task in range(job.tasks):
            placement = placer.find(job)
            if placement is None:
                statement.rollback(mark)
                break
            statement.bind(job, task, placement)


def test_a_user_whose_tasks_stop_during_the_walk_comes_before_the_users_it_trailed():
    # alice holds no GPU, carol one, bob two: alice's job goes first, bob's last by the standings the walk
    # set out with. Once alice's job is placed and bob's task stops (a preemption), bob holds none: his
    # job comes next, before carol's earlier one, though the walk last compared him behind her.
    one = TaskRequest(1, cpus=1, memory_gib=1)
    running = [JobSpec("r-bob", "p", TaskRequest(2, cpus=1, memory_gib=1), submitted=0.0, started=0.0, seq=0,
                       placements=(TaskPlacement("n0", (0, 1)),), user="bob"),
               JobSpec("r-carol", "p", one, submitted=0.0, started=0.0, seq=1,
                       placements=(TaskPlacement("n0", (2,)),), user="carol")]
    waiting = [JobSpec(job_id, "p", one, submitted=float(seq), seq=10 + seq, user=user)
               for seq, (job_id, user) in enumerate([("c1", "carol"), ("b1", "bob"), ("a1", "alice"),
                                                     ("a2", "alice")])]
    policy = Policy(departments={"default": Department("default", implicit=True)},
                    projects={"p": Project("p", quota={POOL: Resources(gpu=8, cpu=64, memory=512)})},
                    fair_share=FairShare(entry_penalty_s=WINDOW))
    nodes = (NodeSpec("n0", gpus=8, gpu_memory_gib=80.0, cpus=64, memory_gib=512),)
    state = ClusterState(Snapshot(nodes, tuple(running + waiting), NOW, {}), policy, PM)
    state.begin_cycle()
    walk, statement = QueueWalk(state, state.backlog), Statement(state)
    first = next(walk)
    assert first.id == "a1"
    placement = Placer(state).find(first)
    assert placement is not None
    statement.bind(first, 0, placement)
    statement.evict(running[0], 0, "preempt", None, first.id)
    assert [job.id for job in walk] == ["b1", "c1", "a2"]
