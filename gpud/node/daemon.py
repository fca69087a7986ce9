"""Running a NodeAgent as the ``gpud node`` daemon: open the GPU backend, serve until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal

from gpud import sdnotify
from gpud.gpu import GpuBackend, NoGpuError, make_backend
from gpud.node.agent import NodeAgent
from gpud.node.config import NodeConfig

log = logging.getLogger(__name__)


class NodeStartError(RuntimeError):
    """The daemon cannot start; the message tells the operator what to do."""


def open_backend(config: NodeConfig) -> GpuBackend:
    """The GPU backend the configuration names; NodeStartError when NVML finds no GPU."""
    try:
        return make_backend(config.gpu_backend, node_name=config.name, state_dir=config.state_dir,
                            fake_gpus=config.fake_gpus)
    except NoGpuError as exc:
        raise NodeStartError(
            f"found no GPU: {exc}. To run this node without GPUs (tests, demos), start it with "
            f'--fake-gpus N or set gpu_backend = "fake" and fake_gpus = N in the node config.') from None


async def serve(config: NodeConfig, backend: GpuBackend, stop: asyncio.Event | None = None) -> None:
    """Run a NodeAgent until ``stop`` is set or the process gets SIGTERM/SIGINT; tasks keep running after."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    agent = NodeAgent(config, backend)
    try:
        await agent.start()
    except OSError as exc:
        await agent.stop()
        where = config.state_dir if config.run_dir is None else f"{config.state_dir} or {config.run_dir}"
        raise NodeStartError(f"cannot use {exc.filename or where}: {exc.strerror or exc} "
                             f"(state_dir and run_dir in the node config, --state-dir and --run-dir)") from None
    log.info("node %s: %d GPU(s), state in %s, controller %s", config.name, len(backend.gpus()),
             config.state_dir, config.controller_url)
    metrics = await _start_metrics(agent)
    sdnotify.ready(f"node {config.name}: {len(backend.gpus())} GPU(s), controller {config.controller_url}")
    try:
        await stop.wait()
    finally:
        sdnotify.stopping()
        if metrics is not None:
            await metrics.cleanup()
        await agent.stop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def _start_metrics(agent: NodeAgent):
    """The /metrics server, or None when switched off or its address is taken (the node runs on without it)."""
    if not agent.config.metrics_listen:
        return None
    from gpud.node.metrics import start_server

    try:
        return await start_server(agent, agent.config.metrics_listen)
    except OSError as exc:
        log.error("cannot serve metrics on %s: %s; running without /metrics", agent.config.metrics_listen,
                  exc.strerror or exc)
        return None


def run(config: NodeConfig) -> None:
    """Open the backend and serve; NodeStartError when the node cannot start."""
    if not config.cluster_key:
        raise NodeStartError("no cluster key: set cluster_key_file in the node config or pass --cluster-key-file")
    if config.ca_file:
        from gpud.tls import TlsFileError, client_context
        try:
            client_context(config.ca_file)
        except TlsFileError as exc:
            raise NodeStartError(f"{exc} (ca_file in the node config, --ca-file)") from None
    backend = open_backend(config)
    try:
        asyncio.run(serve(config, backend))
    finally:
        backend.close()
