"""The active jobs kept in listing order: every page of the job list is what sorting every job would give.

Random submits (some out of submit order, as a restore may bring them),
ends (enough to rebuild the order several times), a job listed again, and
filters by state, user and project: following the cursor page by page
yields exactly the matching jobs once each, in (submitted, array index, id)
order, the ended jobs read from the store merged in.
"""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.controller import job_list
from gpud.controller.listing_order import COMPACT_AT, ListingOrder, sort_key
from gpud.jobs import Job

USERS = ["ann", "bob"]
PROJECTS = ["alpha", "beta"]


def make_job(n: int, submitted: float, index: int | None, state: str, user: str, project: str) -> Job:
    job = Job(id=f"{n}" if index is None else f"{n}_{index}", user=user, project=project, command=["true"],
              workdir="/tmp")
    job.submitted, job.array_index, job.state = submitted, index, state
    job.array_id = None if index is None else str(n)
    return job


def all_pages(order: ListingOrder, ended: list[Job], states: set[str], user: str | None, project: str | None,
              limit: int) -> list[str]:
    async def read_ended() -> list[Job]:
        return ended

    listed: list[str] = []
    cursor = None
    while True:
        page, last = asyncio.run(job_list.select_page(order, read_ended if ended else None, states, user, project,
                                                      cursor, limit))
        assert len(page) <= limit
        listed += [job.id for job in page]
        if last is None:
            return listed
        assert last == sort_key(page[-1])
        cursor = job_list.decode_cursor(job_list.encode_cursor(last))


job_specs = st.lists(st.tuples(st.integers(0, 20), st.one_of(st.none(), st.integers(0, 5)),
                               st.sampled_from(["PENDING", "RUNNING"]), st.sampled_from(USERS),
                               st.sampled_from(PROJECTS), st.booleans()), max_size=60)


@settings(max_examples=examples(150), deadline=None)
@given(specs=job_specs, ended_specs=job_specs, states=st.sets(st.sampled_from(["PENDING", "RUNNING", "COMPLETED"]),
                                                             min_size=1),
       user=st.sampled_from([None, *USERS]), project=st.sampled_from([None, *PROJECTS]), limit=st.integers(1, 7))
def test_every_page_follows_the_listing_order(specs, ended_specs, states, user, project, limit):
    order, active = ListingOrder(), {}
    for n, (submitted, index, state, who, where, ends) in enumerate(specs):
        job = make_job(n, float(submitted), index, state, who, where)
        order.add(job)
        active[job.id] = job
        if ends:
            order.remove(job)
            del active[job.id]
    for job in list(active.values())[::3]:
        order.add(job)  # listed again: still once
    ended = [make_job(1000 + n, float(submitted), index, "COMPLETED", who, where)
             for n, (submitted, index, _, who, where, _) in enumerate(ended_specs)]
    expected = sorted((job for job in [*active.values(), *ended] if job.state in states
                       and (user is None or job.user == user) and (project is None or job.project == project)),
                      key=sort_key)
    wanted_ended = ended if "COMPLETED" in states else []
    assert all_pages(order, wanted_ended, states, user, project, limit) == [job.id for job in expected]


def test_ended_jobs_leave_the_order_and_their_keys_are_dropped():
    order = ListingOrder()
    jobs = [make_job(n, float(n), None, "PENDING", "ann", "alpha") for n in range(3 * COMPACT_AT)]
    for job in jobs:
        order.add(job)
    for job in jobs[: 2 * COMPACT_AT + 10]:
        order.remove(job)
    assert len(order) == COMPACT_AT - 10
    assert len(order._keys) < 2 * COMPACT_AT  # rebuilt: ended jobs' keys are not walked forever
    assert all_pages(order, [], {"PENDING"}, None, None, 100) == [job.id for job in jobs[2 * COMPACT_AT + 10:]]
