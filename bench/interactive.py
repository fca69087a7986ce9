"""Interactive terminals through the controller: keystroke echo latency and output throughput.

Starts a real controller and a node daemon with fake GPUs (separate
processes on 127.0.0.1, as tests/daemons.py does), runs an interactive job,
and over the job's attach WebSocket (the path gpuctl takes: client ->
controller -> node's link -> PTY and back) measures:
  echo      one keystroke to its echo on the job's terminal, one at a time
            (median and 99th percentile);
  output    MiB/s of a command's output reaching the client;
  start     submit -> first output of the job's terminal (gpuctl run's wait,
            on an idle cluster).
    python bench/interactive.py [--keys 300] [--mib 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "tests"))

from daemons import LiveCluster  # noqa: E402


async def attach(cluster: LiveCluster, job: str, path: str = "attach",
                 params: list | None = None) -> tuple[aiohttp.ClientSession, object]:
    """A WebSocket to the job's terminal, as gpuctl opens it."""
    http = aiohttp.ClientSession()
    ws = await http.ws_connect(f"ws://127.0.0.1:{cluster.port}/api/v1/jobs/{job}/{path}", params=params or [],
                               headers={"Authorization": f"Bearer {cluster.admin_token}"}, max_msg_size=1 << 24)
    return http, ws


async def until(ws, predicate) -> bytes:
    """The terminal's output until ``predicate`` holds for it."""
    seen = b""
    while not predicate(seen):
        frame = await ws.receive(timeout=60)
        if frame.type != aiohttp.WSMsgType.BINARY:
            raise RuntimeError(f"the terminal ended: {frame.data!r}")
        seen += frame.data
    return seen


async def measure(cluster: LiveCluster, keys: int, mib: int) -> dict:
    """The three figures, from one interactive job."""
    began = time.perf_counter()
    job = cluster.submit(command=["sh", "-c", "echo ready; exec cat"], gpus=1, interactive=True)
    cluster.wait_state(job, "RUNNING", timeout=60)
    http, ws = await attach(cluster, job)
    await until(ws, lambda b: b"ready" in b)
    start_s = time.perf_counter() - began
    echo = []
    for i in range(keys):
        key = b"abcdefghij"[i % 10:i % 10 + 1]
        sent = time.perf_counter()
        await ws.send_bytes(key)
        await until(ws, lambda b: key in b)
        echo.append(time.perf_counter() - sent)
    await ws.close()
    await http.close()
    size = mib * 1024 * 1024
    script = f"head -c {size} /dev/zero | tr '\\0' x; echo END"
    http, ws = await attach(cluster, job, "exec", [("argv", "sh"), ("argv", "-c"), ("argv", script)])
    sent = time.perf_counter()
    got = 0
    while True:
        frame = await ws.receive(timeout=120)
        if frame.type != aiohttp.WSMsgType.BINARY:
            break
        got += len(frame.data)
    output_s = time.perf_counter() - sent
    await ws.close()
    await http.close()
    cluster.api("POST", f"/api/v1/jobs/{job}/cancel")
    echo.sort()
    return {"start_s": start_s, "echo_median_ms": statistics.median(echo) * 1000,
            "echo_p99_ms": echo[int(len(echo) * 0.99) - 1] * 1000, "output_mib_s": got / output_s / 2**20,
            "output_mib": got / 2**20}


def main(argv: list[str] | None = None) -> int:
    """Start the daemons, measure, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=300)
    parser.add_argument("--mib", type=int, default=32)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        cluster = LiveCluster(Path(root))
        try:
            cluster.start_controller()
            cluster.start_node("n1", gpus=4)
            figures = asyncio.run(measure(cluster, args.keys, args.mib))
        finally:
            cluster.close()
    print(f"start    submit -> first output   {figures['start_s'] * 1000:8.0f} ms")
    print(f"echo     keystroke -> echo        {figures['echo_median_ms']:8.2f} ms median, "
          f"{figures['echo_p99_ms']:.2f} ms p99 ({args.keys} keys)")
    print(f"output   command -> client        {figures['output_mib_s']:8.1f} MiB/s "
          f"({figures['output_mib']:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
