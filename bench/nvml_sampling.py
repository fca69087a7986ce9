"""What a node samples of a job's GPU through NVML: run a CUDA load and print each sample.

Starts ``bench/cuda_load.py`` (GIB GiB and a spinning kernel on GPU 0, for
SECONDS), waits a few seconds, then prints, once a second, what the NVML
backend reports of that process and what the node's sampling makes of it
(the ``gpu_util`` and ``gpu_memory_gib`` a heartbeat carries for its task).
Needs an NVIDIA GPU and driver.
    python bench/nvml_sampling.py [--gib 2] [--seconds 9]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from gpud.gpu.nvml import NvmlBackend
from gpud.node.slicerun import UsageMonitor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=9.0)
    args = parser.parse_args()
    backend = NvmlBackend()
    monitor = UsageMonitor(backend)
    load = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "cuda_load.py"),
                             str(args.gib), str(args.seconds)], start_new_session=True)
    try:
        time.sleep(min(5.0, args.seconds / 2))
        for _ in range(3):
            monitor.poll(force=True)
            print(f"pid {load.pid}: NVML {[p for p in backend.processes() if p.pid == load.pid]}; sampled "
                  f"gpu_util {monitor.utilization_of(load.pid, 0):.0f}%, "
                  f"gpu_memory_gib {monitor.memory_of(load.pid, 0):.2f}", flush=True)
            time.sleep(1.0)
    finally:
        load.wait()
        backend.close()


if __name__ == "__main__":
    main()
