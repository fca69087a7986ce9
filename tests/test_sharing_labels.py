"""What `gpuctl show` says of a shared GPU's compute and memory on a node that cannot measure them (fake GPUs)."""

from __future__ import annotations

from daemons import POLICY, LiveCluster
from gpud.cli.job_cmd import show_text


def test_fair_slicing_and_memory_policing_on_fake_gpus_are_shown_as_advisory(tmp_path):
    cluster = LiveCluster(tmp_path, policy=POLICY + '\n[time_slicing]\nmode = "fair"\n')
    try:
        cluster.start_controller()
        cluster.start_node("n1", gpus=1)
        job_id = cluster.submit(command=["sleep", "60"], gpus=0.5, project="alpha")
        job = cluster.wait_state(job_id, "RUNNING")
        sharing = job["sharing"]
        assert not sharing["compute"]["enforced"] and not sharing["memory"]["enforced"]
        text = show_text(job, job["started"])
        assert "of the GPU, advisory (advisory: node n1 cannot measure GPU utilisation" in text, text
        assert "slice, advisory (advisory: node n1 cannot measure each process's GPU memory)" in text, text
    finally:
        cluster.close()
