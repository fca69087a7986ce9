"""What the controller does for shared GPUs: the [time_slicing] policy, compute request/limit, refused gangs,
the slice fields of a start order, and the job view saying what is enforced."""

from __future__ import annotations

import tomllib

import pytest

from gpud.controller.job_reason import recorded
from gpud.controller.nodes import Gpu, NodeRecord
from gpud.controller.node_commands import start_command
from gpud.controller.views import job_view, sharing_view
from gpud.errors import ConfigError
from gpud.jobs import Job
from gpud.model import TaskPlacement
from gpud.policy import Policy, Project, TimeSlicing
from gpud.policy_file import parse_policy
from gpud.submission import Capacity, SubmitError, admit, read_job

POLICY = Policy(projects={"p": Project("p")})


def parse(text: str) -> Policy:
    return parse_policy(tomllib.loads(text), "policy.toml")


def submit(**fields):
    payload = {"project": "p", "command": ["true"], "workdir": "/tmp", **fields}
    return admit(read_job(payload), user="alice", admin=False, policy=POLICY, capacity=Capacity()).job


def refused(**fields) -> SubmitError:
    with pytest.raises(SubmitError) as info:
        submit(**fields)
    return info.value


# --- policy --------------------------------------------------------------------------------------

def test_time_slicing_defaults_to_off_with_the_reference_lease_and_precision():
    slicing = parse("").time_slicing
    assert (slicing.mode, slicing.lease_ms, slicing.precision) == ("off", 250.0, 0.05)
    assert slicing.lease_ms / slicing.precision == 5000.0
    assert slicing.memory_enforce and slicing.memory_tolerance == 0.05


def test_time_slicing_table_is_read():
    slicing = parse('[time_slicing]\nmode = "fair"\nlease_ms = 50\nprecision = 0.1\nmemory_tolerance = 0.1\n'
                    'memory_enforce = false\nmemory_grace = 2\n').time_slicing
    assert slicing == TimeSlicing("fair", 50.0, 0.1, 0.1, False, 2.0)


@pytest.mark.parametrize("text, key", [
    ('mode = "fiar"', "time_slicing.mode"),
    ("precision = 0", "time_slicing.precision"),
    ("precision = 2", "time_slicing.precision"),
    ("lease_ms = -1", "time_slicing.lease_ms"),
    ("lease = 5", "time_slicing.lease"),
])
def test_bad_time_slicing_settings_are_refused_by_key(text, key):
    with pytest.raises(ConfigError) as info:
        parse("[time_slicing]\n" + text + "\n")
    assert key in str(info.value)


def test_fiar_suggests_fair():
    with pytest.raises(ConfigError) as info:
        parse('[time_slicing]\nmode = "fiar"\n')
    assert "fair" in str(info.value)


# --- the reference's request/limit table ---------------------------------------------------------

@pytest.mark.parametrize("mode, gpus, memory, expected", [
    ("strict", 0.25, None, (0.25, 0.25)),
    ("fair", 0.25, None, (0.25, 1.0)),
    ("strict", 0.0, 20.0, (0.0, 1.0)),
    ("fair", 0.0, 20.0, (0.0, 1.0)),
])
def test_compute_request_and_limit_follow_the_reference_table(mode, gpus, memory, expected):
    assert TimeSlicing(mode).compute(gpus, memory) == expected


def test_a_jobs_own_request_and_limit_replace_the_table():
    assert TimeSlicing("fair").compute(0.5, None, 0.3, 0.8) == (0.3, 0.8)
    assert TimeSlicing("strict").compute(0.5, None, None, 0.9) == (0.5, 0.9)
    assert TimeSlicing("strict").compute(0.5, None, 0.3, None) == (0.3, 0.3)


# --- submission ----------------------------------------------------------------------------------

def test_a_gang_on_shared_gpus_is_refused_with_the_reason():
    error = refused(gpus=0.5, tasks=2)
    assert error.field == "tasks" and error.status == 422
    assert "cannot share GPUs" in str(error) and "timeouts" in str(error)
    assert refused(gpu_memory_gib=10, tasks=4).field == "tasks"


def test_a_gang_of_whole_gpus_and_a_single_fraction_task_are_fine():
    assert submit(gpus=1, tasks=2).tasks == 2
    assert submit(gpus=0.5).tasks == 1


def test_own_compute_request_and_limit_are_kept():
    job = submit(gpus=0.5, gpu_compute_request=0.25, gpu_compute_limit=0.75)
    assert (job.gpu_compute_request, job.gpu_compute_limit) == (0.25, 0.75)


@pytest.mark.parametrize("fields, field", [
    ({"gpus": 1, "gpu_compute_request": 0.5}, "gpu_compute_request"),
    ({"gpus": 0.5, "gpu_compute_request": 0.6}, "gpu_compute_request"),
    ({"gpus": 0.5, "gpu_compute_limit": 1.5}, "gpu_compute_limit"),
    ({"gpus": 0.5, "gpu_compute_request": 0.4, "gpu_compute_limit": 0.3}, "gpu_compute_limit"),
    ({"gpus": 0.5, "gpu_compute_limit": 0.3}, "gpu_compute_limit"),
    ({"gpu_memory_gib": 10, "gpu_compute_request": -0.1}, "gpu_compute_request"),
])
def test_compute_request_and_limit_outside_bounds_are_refused(fields, field):
    assert refused(**fields).field == field


# --- start orders --------------------------------------------------------------------------------

def node() -> NodeRecord:
    return NodeRecord("n1", gpus=[Gpu(0, "GPU-0", memory_gib=80.0), Gpu(1, "GPU-1", memory_gib=80.0)])


def placed(job: Job, gpus=(1,), share=0.25) -> Job:
    job.id = "9"
    job.runs[0].placement = TaskPlacement("n1", gpus, share)
    job.runs[0].attempt = 0
    return job


def order_spec(job: Job, slicing: TimeSlicing) -> dict:
    n = node()
    return start_command(job, 0, job.runs[0], n, {"n1": n}, 30.0, slicing)["spec"]


def test_a_strict_fraction_gets_its_compute_share_and_memory_slice():
    spec = order_spec(placed(submit(gpus=0.25)), TimeSlicing("strict", 50.0, 0.1))
    assert spec["time_slicing"] == {"mode": "strict", "lease_ms": 50.0, "precision": 0.1, "request": 0.25,
                                    "limit": 0.25}
    assert spec["memory_slice"]["limit_mib"] == 0.25 * 80 * 1024
    assert spec["memory_slice"]["fraction"] == 0.25 and spec["project"] == "p"


def test_a_gpu_memory_job_in_fair_mode_has_request_0_limit_1():
    spec = order_spec(placed(submit(gpu_memory_gib=20.0)), TimeSlicing("fair"))
    assert (spec["time_slicing"]["request"], spec["time_slicing"]["limit"]) == (0.0, 1.0)
    assert spec["memory_slice"]["limit_mib"] == 20 * 1024


def test_with_slicing_off_only_the_memory_slice_is_sent():
    spec = order_spec(placed(submit(gpus=0.5), share=0.5), TimeSlicing("off"))
    assert "time_slicing" not in spec and spec["memory_slice"]["limit_mib"] == 40 * 1024


def test_whole_gpus_are_not_sliced():
    spec = order_spec(placed(submit(gpus=1), share=1.0), TimeSlicing("strict"))
    assert "time_slicing" not in spec and "memory_slice" not in spec


def test_the_order_is_understood_by_the_node():
    from gpud.node.spec import TaskSpec, sharing_env
    spec = TaskSpec.decode(order_spec(placed(submit(gpus=0.25)), TimeSlicing("strict")))
    assert spec.sliced and spec.project == "p"
    env = sharing_env(spec)
    assert env["GPUD_GPU_MEMORY_LIMIT_MIB"] == str(20 * 1024)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2500" and env["GPUD_COMPUTE_REQUEST"] == "0.25"
    assert env["PYTHONPATH"].endswith("gpud/node/startup")


# --- the job view --------------------------------------------------------------------------------

def test_show_says_compute_and_memory_are_enforced_when_slicing():
    job = placed(submit(gpus=0.25))
    view = job_view(job, recorded(""), {"n1": node()}, 0.0, TimeSlicing("strict"))
    sharing = view["sharing"]
    assert sharing["compute"]["enforced"] and sharing["compute"]["mode"] == "strict"
    assert sharing["memory"]["enforced"] and sharing["memory"]["limit_gib"] == 20.0


def test_show_says_compute_is_advisory_when_slicing_is_off_and_memory_when_not_enforced():
    sharing = sharing_view(placed(submit(gpus=0.25)), {"n1": node()}, TimeSlicing("off", memory_enforce=False))
    assert not sharing["compute"]["enforced"] and "advisory" in sharing["compute"]["how"]
    assert not sharing["memory"]["enforced"] and "advisory" in sharing["memory"]["how"]


def test_jobs_with_whole_gpus_have_no_sharing():
    assert sharing_view(submit(gpus=1), {}, TimeSlicing("strict")) is None


# --- through the controller's state machine ------------------------------------------------------

@pytest.fixture
def cluster():
    from gpud.controller.cluster import Cluster
    from gpud.controller.persist import Persister
    from gpud.plugins import make_plugin_manager
    policy = parse_policy({"time_slicing": {"mode": "fair", "lease_ms": 100, "precision": 0.1},
                           "projects": [{"name": "p", "gpu_quota": 1}]}, "test")
    state = Cluster(policy, make_plugin_manager(), Persister(None, None), lambda: 1000.0)
    state.node_messages.register(NodeRecord("n1", cpus=8, memory_gib=64, gpus=[Gpu(0, "GPU-0", memory_gib=80.0)]), tasks=[])
    state.outbox.take()
    return state


def test_two_halves_share_a_gpu_and_a_memory_offender_fails_with_the_reason(cluster):
    from test_cluster_state import cycle, report
    from gpud.submission import Submission
    ids = [cluster.job_service.submit([Submission(Job(id="", user="u", project="p", workdir="/tmp", command=["true"],
                                                      gpus=0.5))], {})[0] for _ in range(2)]
    jobs = {i: cluster.jobs[i] for i in ids}
    starts = cycle(cluster)["n1"]
    assert sorted(o["job"] for o in starts) == sorted(ids)
    for order in starts:
        assert order["spec"]["time_slicing"] == {"mode": "fair", "lease_ms": 100.0, "precision": 0.1,
                                                 "request": 0.5, "limit": 1.0}
        assert order["spec"]["memory_slice"]["limit_mib"] == 40 * 1024
        report(cluster, order, "running", pid=100)
    reason = "gpu memory: used 50.0 GiB, over its slice of 40.0 GiB (+5% tolerance)"
    report(cluster, starts[0], "exited", exit_code=None, term_signal=15, reason=reason,
           cause="gpu_memory")
    job = jobs[starts[0]["job"]]
    assert (job.state, job.reason) == ("FAILED", f"task 0 was stopped by the node: {reason}")


def test_show_says_advisory_where_the_node_cannot_measure_what_the_share_needs():
    blind = node()
    blind.gpu_measures = []  # a fake GPU: it reports only the usage a test sets
    fair = sharing_view(placed(submit(gpus=0.25)), {"n1": blind}, TimeSlicing("fair"))
    assert not fair["compute"]["enforced"] and "cannot measure GPU utilisation" in fair["compute"]["how"]
    assert not fair["memory"]["enforced"] and "cannot measure each process's GPU memory" in fair["memory"]["how"]
    strict = sharing_view(placed(submit(gpus=0.25)), {"n1": blind}, TimeSlicing("strict"))
    assert strict["compute"]["enforced"]  # strict leases need no measurement
    measured = node()
    measured.gpu_measures = ["utilization", "memory"]
    fair = sharing_view(placed(submit(gpus=0.25)), {"n1": measured}, TimeSlicing("fair"))
    assert fair["compute"]["enforced"] and fair["memory"]["enforced"]


def test_a_node_says_what_its_gpus_measure_when_it_registers():
    from gpud.controller.node_link import node_from_register
    record = node_from_register({"node": "n1", "limits": {"enforced": [], "gpu_measures": ["memory"]}}, "")
    assert record.gpu_measures == ["memory"]
    with pytest.raises(ValueError, match="gpu_measures"):
        node_from_register({"node": "n1", "limits": {"enforced": [], "gpu_measures": "memory"}}, "")
