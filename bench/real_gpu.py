"""What only a real GPU shows, checked through a live `gpud up` and `gpuctl`, as a user would.

    python bench/real_gpu.py [--seconds 15] [--fake-gpus N] [--json]

On a host with NVIDIA GPUs (NVML and PyTorch with CUDA), it starts `gpud up`
on 127.0.0.1 with a policy of strict time-slicing and prints:

- discovery: the GPUs `gpuctl nodes` reports (model, memory) against NVML's own count;
- isolation: what a 1-GPU job and a 0-GPU job can see and open
  (CUDA_VISIBLE_DEVICES, CUDA's device count, opening /dev/nvidia0);
- time-slicing: matrix products per second of one job alone on a GPU, then
  of two 0.5-GPU jobs sharing it, and each one's part of the alone rate;
- a memory slice: a job that stays inside `--gpu-memory` completes; one
  that allocates beyond it fails (PyTorch's per-process fraction, which gpud
  sets, refuses the allocation); one that overrides that fraction is stopped
  by the node's watchdog, with the reason gpud gives;
- accounting: `gpuctl report --by project`, with the GPU utilisation and
  peak memory the node sampled through NVML while the jobs ran.

With --fake-gpus N (no GPU needed) the same run uses fake GPUs and a CPU
stand-in for the matrix products: it checks the script, not the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

LOAD = textwrap.dedent('''
    import os, sys, time
    mode, seconds = sys.argv[1], float(sys.argv[2])
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        torch, cuda = None, False
    print("CUDA_VISIBLE_DEVICES=" + repr(os.environ.get("CUDA_VISIBLE_DEVICES")))
    print("cuda_devices=" + str(torch.cuda.device_count() if cuda else 0))
    if cuda:
        print("device_name=" + torch.cuda.get_device_name(0))
    if mode == "see":
        try:
            os.close(os.open("/dev/nvidia0", os.O_RDWR))
            print("open_dev_nvidia0=ok")
        except OSError as error:
            print("open_dev_nvidia0=" + type(error).__name__ + ":" + str(error.errno))
    elif mode == "matmul":
        if cuda:
            a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
            torch.cuda.synchronize()
            step = lambda: torch.matmul(a, b)
            sync = torch.cuda.synchronize
        else:
            step = lambda: sum(i * i for i in range(20000))
            sync = lambda: None
        done, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            for _ in range(20):
                step()
            sync()
            done += 20
        print("rate=%.1f" % (done / (time.monotonic() - start)))
    elif mode.startswith("alloc"):
        gib = float(mode.split(":")[1])
        if cuda and mode.startswith("alloc-ignoring-hint"):
            torch.cuda.set_per_process_memory_fraction(1.0)  # a job that overrides gpud's PyTorch hint
        if cuda:
            block = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
            block.fill_(1)
            torch.cuda.synchronize()
        print("allocated_gib=%.1f" % gib, flush=True)
        time.sleep(seconds)
        print("held_to_the_end")
''')


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """`gpud up` in a scratch directory, and gpuctl against it."""

    def __init__(self, fake_gpus: int | None, seconds: float, job_timeout: float, keep_log: str | None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gpud-realgpu-"))
        self.port = free_port()
        self.env = {**os.environ, "HOME": str(self.root), "XDG_CONFIG_HOME": str(self.root / "config"),
                    "XDG_DATA_HOME": str(self.root / "data"), "GPUD_URL": f"http://127.0.0.1:{self.port}"}
        policy = self.root / "policy.toml"
        policy.write_text(textwrap.dedent(f'''
            min_runtime = 0
            grace_period = 5
            [time_slicing]
            mode = "strict"
            memory_grace = 3
            [[projects]]
            name = "lab"
            gpu_quota = {fake_gpus or 8}
        '''))
        self.load = self.root / "load.py"
        self.load.write_text(LOAD)
        bin_dir = Path(sys.executable).parent
        self.gpud = str(bin_dir / "gpud") if (bin_dir / "gpud").exists() else shutil.which("gpud") or "gpud"
        self.gpuctl = str(bin_dir / "gpuctl") if (bin_dir / "gpuctl").exists() else shutil.which("gpuctl") or "gpuctl"
        command = [self.gpud, "up", "--port", str(self.port), "--state-dir", str(self.root / "state"),
                   "--policy", str(policy)]
        if fake_gpus:
            command += ["--fake-gpus", str(fake_gpus)]
        self.log = open(self.root / "gpud.log", "w")
        self.process = subprocess.Popen(command, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        self.seconds = seconds
        self.job_timeout = job_timeout
        self.keep_log = keep_log

    def ctl(self, *args: str, check: bool = True) -> str:
        """gpuctl's output; raises with its stderr when it fails and ``check``."""
        done = subprocess.run([self.gpuctl, *args], env=self.env, cwd=self.root, capture_output=True, text=True,
                              timeout=60)
        if check and done.returncode:
            raise RuntimeError(f"gpuctl {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def wait_up(self, timeout: float = 90.0) -> None:
        """Until a node with GPUs is up."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError("gpud up exited: " + (self.root / "gpud.log").read_text()[-2000:])
            try:
                nodes = json.loads(self.ctl("nodes", "--json", check=False) or "null")
            except ValueError:
                nodes = None
            if nodes:
                listed = nodes if isinstance(nodes, list) else nodes.get("nodes", [])
                if any(n.get("state") in ("up", "idle", "mixed", "allocated") for n in listed):
                    return
            time.sleep(0.5)
        raise RuntimeError("no node came up: " + (self.root / "gpud.log").read_text()[-2000:])

    def submit(self, *options: str, mode: str, seconds: float | None = None) -> str:
        """Submit the stand-in load in ``mode``; returns the job id."""
        return self.ctl("submit", "-p", "lab", "--export-env", "--parsable", *options, "--",
                        sys.executable, str(self.load), mode, str(seconds or self.seconds)).strip()

    def finish(self, job: str) -> dict:
        """The job's view once it has ended."""
        timeout = self.job_timeout
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            view = json.loads(self.ctl("show", job, "--json"))
            if view["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL"):
                return view
            time.sleep(0.5)
        raise RuntimeError(f"job {job} did not end in {timeout} s\n{self.diagnosis(job)}")

    def diagnosis(self, job: str) -> str:
        """What gpuctl and the daemon's log say about a job that did not end."""
        parts = [self.ctl(*args, check=False) for args in (("queue",), ("show", job), ("why", job), ("logs", job))]
        return "\n".join(parts) + "\n--- gpud up log ---\n" + (self.root / "gpud.log").read_text()[-4000:]

    def output(self, job: str) -> dict[str, str]:
        """The key=value lines the job printed."""
        lines = self.ctl("logs", job, check=False).splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line and " " not in line.split("=", 1)[0])

    def close(self) -> None:
        """Stop gpud up and remove its directory."""
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        if self.keep_log:
            shutil.copyfile(self.root / "gpud.log", self.keep_log)
        shutil.rmtree(self.root, ignore_errors=True)


def nvml_count() -> int | None:
    """GPUs NVML sees on this host, None without NVML."""
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def check(cluster: Cluster) -> dict:
    """Run every check; returns the figures."""
    figures: dict = {"nvml_gpus": nvml_count()}
    figures["nodes"] = cluster.ctl("nodes")
    see_gpu = cluster.submit("--gpus", "1", mode="see")
    see_none = cluster.submit("--gpus", "0", mode="see")
    for name, job in (("with_1_gpu", see_gpu), ("with_0_gpus", see_none)):
        view = cluster.finish(job)
        figures[name] = {"state": view["state"], **cluster.output(job)}

    alone = cluster.submit("--gpus", "1", mode="matmul")
    cluster.finish(alone)
    alone_rate = float(cluster.output(alone).get("rate", "nan"))
    halves = [cluster.submit("--gpus", "0.5", mode="matmul") for _ in range(2)]
    shared = []
    for job in halves:
        view = cluster.finish(job)
        shared.append(float(cluster.output(job).get("rate", "nan")))
        figures.setdefault("half_sharing", view.get("sharing"))
    figures["timeslice"] = {"alone_rate": alone_rate, "half_rates": shared,
                            "half_parts": [round(r / alone_rate, 3) for r in shared]}

    inside = cluster.submit("--gpu-memory", "8G", mode="alloc:4", seconds=8)
    beyond = cluster.submit("--gpu-memory", "8G", mode="alloc:16", seconds=30)
    ignoring = cluster.submit("--gpu-memory", "8G", mode="alloc-ignoring-hint:16", seconds=30)
    for name, job in (("inside_slice", inside), ("beyond_slice", beyond), ("beyond_slice_ignoring_hint", ignoring)):
        view = cluster.finish(job)
        figures[name] = {"state": view["state"], "reason": view.get("reason"), "sharing": view.get("sharing"),
                         **cluster.output(job)}
    figures["report"] = json.loads(cluster.ctl("report", "--by", "project", "--json"))
    return figures


def main() -> int:
    """Parse the options, run the checks, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="how long each matrix-product job runs")
    parser.add_argument("--fake-gpus", type=int, default=None, help="fake GPUs and a CPU stand-in (checks the script)")
    parser.add_argument("--job-timeout", type=float, default=120.0, help="seconds a job may take before the run fails")
    parser.add_argument("--keep-log", metavar="FILE", help="copy gpud up's log here at the end")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.fake_gpus is None and not nvml_count():
        print("no NVIDIA GPU here (NVML found none): nothing to check; --fake-gpus N checks the script")
        return 0
    cluster = Cluster(args.fake_gpus, args.seconds, args.job_timeout, args.keep_log)
    try:
        cluster.wait_up()
        figures = check(cluster)
    finally:
        cluster.close()
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(figures.pop("nodes"))
        for key, value in figures.items():
            print(f"{key}: {json.dumps(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
