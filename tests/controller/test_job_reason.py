"""A job's reason as the API gives it: a code beside the words, and the same words whichever cycle judged it last."""

from __future__ import annotations

from gpud.cli.slurm.fields import squeue_line
from gpud.controller.views import job_view, public_view
from gpud.jobs import Dependency
from gpud.lifecycle import PENDING, RUNNING

from test_why import cycle, make_cluster, submit

PROJECTS = {"projects": [{"name": "alpha", "gpu_quota": 4}, {"name": "beta", "gpu_quota": 4}]}


def test_a_running_elastic_gang_says_what_it_runs_the_same_way_after_every_cycle():
    cluster = make_cluster(PROJECTS, [("n1", 4, 64)])
    submit(cluster, "alpha", gpus=2)
    cycle(cluster)
    gang = submit(cluster, "alpha", gpus=1, tasks=4, min_tasks=2)
    cycle(cluster)  # the cycle that starts the gang with 2 of its 4 tasks
    assert gang.state == RUNNING
    first = cluster.waits.reason(gang)
    cycle(cluster)  # a later cycle: it only finds the other tasks no room
    later = cluster.waits.reason(gang)
    assert first == later, (first.text, later.text)
    assert later.code == "partial" and later.short == "runs 2 of its 4 tasks"
    assert later.text.startswith("runs 2 of its 4 tasks; the others wait: project alpha: "), later.text
    assert "; waiting for GPUs: " in later.text


def test_each_kind_of_pending_reason_has_its_code():
    cluster = make_cluster(PROJECTS, [("n1", 2, 64)])
    first = submit(cluster, "alpha", gpus=2)
    held = submit(cluster, "alpha", gpus=1, hold=True)
    waits = submit(cluster, "beta", gpus=1, depends=[Dependency("afterok", first.id)])
    short = submit(cluster, "beta", gpus=2)
    assert cluster.waits.reason(short).code == "undecided"
    cycle(cluster)
    assert first.state == RUNNING and short.state == PENDING
    assert cluster.waits.reason(held).code == "held"
    assert cluster.waits.reason(waits).code == "dependency"
    reason = cluster.waits.reason(short)
    assert reason.code == "shortage", reason
    assert reason.short.startswith("project beta: ") and reason.text.startswith(reason.short + "; waiting for GPUs")


def test_squeue_shows_the_reason_in_short_and_strangers_never_see_the_workdir():
    cluster = make_cluster(PROJECTS, [("n1", 2, 64)])
    submit(cluster, "alpha", gpus=2)
    job = submit(cluster, "alpha", gpus=1, hold=True)
    cycle(cluster)
    view = job_view(job, cluster.waits.reason(job), cluster.nodes, 1000.0)
    assert (view["reason_code"], view["reason_short"]) == ("held", f"held: run gpuctl release {job.id}")
    assert squeue_line("%i %R|%r", view) == f"{job.id} (held: run gpuctl release {job.id})|held: run gpuctl release {job.id}"
    running = next(j for j in cluster.jobs.values() if j.state == RUNNING)
    shown = job_view(running, cluster.waits.reason(running), cluster.nodes, 1000.0)
    assert shown["reason_code"] is None and squeue_line("%R", shown) == "n1"
    job.reason = "requeued: node n9 lost /tmp/x"
    job.hold = False
    job.workdir = "/tmp/x"
    hidden = public_view(job_view(job, cluster.waits.reason(job), cluster.nodes, 1000.0), job)
    assert hidden["reason_code"] == "requeued" and "/tmp/x" not in hidden["reason_short"], hidden["reason_short"]
