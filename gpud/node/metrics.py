"""The node daemon's /metrics page: its tasks by state, its GPUs' health, its connections to the controller."""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING

from aiohttp import web

from gpud.metrics import metric
from gpud.node.taskstate import EXITED, RUNNING, STARTING

if TYPE_CHECKING:
    from gpud.node.agent import NodeAgent

log = logging.getLogger(__name__)
DEFAULT_LISTEN = "127.0.0.1:6831"
TASK_STATES = (STARTING, RUNNING, EXITED)


def render(agent: NodeAgent, started: float) -> str:
    """Every node metric in the Prometheus text format."""
    node = agent.config.name
    by_state = Counter(state.state for state in agent.tasks.states())
    gpus = agent.backend.gpus()
    healthy = sum(1 for gpu in gpus if gpu.healthy)
    link = agent.link
    lines: list[str] = []
    lines += metric("gpud_node_tasks", "gauge", "Tasks this node knows, by state (exited: not yet acknowledged).",
                    [({"node": node, "state": s}, by_state.get(s, 0)) for s in TASK_STATES])
    lines += metric("gpud_node_gpus", "gauge", "This node's GPUs by health.",
                    [({"node": node, "health": "healthy"}, healthy),
                     ({"node": node, "health": "unhealthy"}, len(gpus) - healthy)])
    lines += metric("gpud_node_connected", "gauge", "1 while the node is registered with the controller.",
                    [({"node": node}, 1 if link.connected.is_set() else 0)])
    lines += metric("gpud_node_registrations_total", "counter",
                    "Times the node registered with the controller (each reconnect adds one).",
                    [({"node": node}, getattr(link, "registrations", 0))])
    errors = [(gpu, slicer.history[-1].error_pp()) for gpu, slicer in sorted(agent.slices.slicers.items())
              if slicer.history]
    lines += metric("gpud_node_timeslice_error_pp", "gauge",
                    "Time-slicing error of each shared GPU's last plan: the largest gap between a job's target "
                    "and what it held, in percentage points.",
                    [({"node": node, "gpu": str(gpu)}, round(error, 3)) for gpu, error in errors])
    lines += metric("gpud_node_uptime_seconds", "gauge", "Seconds since the node daemon started.",
                    [({"node": node}, round(time.time() - started, 3))])
    return "\n".join(lines) + "\n"


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 hosts in brackets) as a (host, port) pair; ValueError when malformed."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT such as {DEFAULT_LISTEN}, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


async def start_server(agent: NodeAgent, listen: str) -> web.AppRunner:
    """Serve /metrics for ``agent`` on ``listen``; the caller cleans the returned runner up."""
    started = time.time()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=render(agent, started), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = parse_listen(listen)
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError:
        await runner.cleanup()
        raise
    log.info("node metrics on http://%s:%d/metrics", host, port)
    return runner
