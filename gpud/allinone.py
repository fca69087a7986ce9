"""All-in-one gpud (``gpud up``): a controller and a node daemon in one process, with everything in one state directory."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Mapping, TextIO

from gpud.controller.config import DEFAULT_PORT, ControllerConfig
from gpud.gpu import GpuBackend, NoGpuError, make_backend
from gpud.node.config import NodeConfig

log = logging.getLogger("gpud.up")
CLIENT_MARK = "# written by gpud up"
NODE_UP_TIMEOUT_S = 15.0
LEAD_TIMEOUT_S = 30.0  # with --store: a fresh database's lease is free at once; a held one is not gpud up's
DEFAULT_PROJECT = "default"   # the open project of the default policy; submits go there unless told otherwise


class UpError(RuntimeError):
    """``gpud up`` cannot start; the message says what to do."""


@dataclass(frozen=True, slots=True)
class UpOptions:
    """What ``gpud up`` was asked to run."""

    state_dir: str
    port: int = DEFAULT_PORT
    fake_gpus: int | None = None
    policy: str | None = None
    demo: bool = False
    exit_when_idle: bool = False
    store_sync: str = "full"
    store: str | None = None  # a PostgreSQL URL; None: the SQLite file in the state directory
    run_dir: str | None = None
    fake_cpus: float | None = None
    fake_memory_gib: float | None = None
    node_name: str = field(default_factory=socket.gethostname)

    def host_resources(self) -> tuple[float | None, float | None]:
        """The CPUs and GiB the node reports: as given, else a realistic host for fake GPUs, else (None) this host's."""
        if self.fake_gpus is None:
            return self.fake_cpus, self.fake_memory_gib
        from gpud.node.config import fake_host_resources
        cpus, memory = fake_host_resources(self.fake_gpus)
        return (cpus if self.fake_cpus is None else self.fake_cpus,
                memory if self.fake_memory_gib is None else self.fake_memory_gib)

    @property
    def url(self) -> str:
        """The controller's URL on the loopback interface."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def controller_dir(self) -> str:
        """The controller's state: the SQLite store, the admin token and the cluster key."""
        return os.path.join(self.state_dir, "controller")

    @property
    def node_dir(self) -> str:
        """The node daemon's state: one directory per task, surviving restarts."""
        return os.path.join(self.state_dir, "node")

    @property
    def policy_path(self) -> str:
        """The policy in force: the one given, or ``policy.toml`` in the state directory."""
        return self.policy or os.path.join(self.state_dir, "policy.toml")

    @property
    def admin_token_path(self) -> str:
        """Where the controller keeps the admin token gpuctl uses."""
        return os.path.join(self.controller_dir, "admin.token")


def default_state_dir(env: Mapping[str, str] = os.environ) -> str:
    """``$XDG_DATA_HOME/gpud``, by default ``~/.local/share/gpud``."""
    base = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "gpud")


def default_policy(gpus: int) -> str:
    """The policy written on the first start: an open project "default" whose quota is all ``gpus`` (so
    interactive work starts at once), and two labs whose quotas fit ``gpus``."""
    alice, bob = max(1, gpus // 2), max(1, gpus // 4)
    return f"""\
# gpud policy, written by gpud up on its first start. Edit it, then run
# `gpuctl policy reload`; a file with a mistake is refused and the old
# policy stays in force. etc/gpud/policy.toml in the source explains every key.

# Seconds a stopped job gets between SIGTERM and SIGKILL.
grace_period = 10

# Seconds a job runs before it may be preempted, so that preemption cannot thrash.
min_runtime = 30

# Anyone may submit here (no `users` list). Its quota is every GPU of this
# machine, so interactive work (gpuctl run, gpuctl notebook: class "build",
# not preemptible, which runs only within quota) starts at once. Lower it
# (`gpuctl policy reload`) to guarantee the labs below their quotas.
[[projects]]
name = "default"
gpu_quota = {gpus}

# Two labs with guaranteed quotas; what is idle is shared between them
# (and "default") by over_quota_weight.
[[projects]]
name = "alice-lab"
gpu_quota = {alice}

[[projects]]
name = "bob-lab"
gpu_quota = {bob}
"""


def write_default_policy(path: str, gpus: int) -> bool:
    """Write the default policy to ``path`` unless a file is already there; True when written."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(default_policy(gpus))
    return True


def client_config_path(env: Mapping[str, str] = os.environ) -> str:
    """Where gpuctl looks for its settings (the same rule as gpud.client.config_path)."""
    from gpud.client import config_path
    return config_path(env)


def write_client_config(url: str, token_file: str, env: Mapping[str, str] = os.environ,
                        project: str | None = None) -> tuple[str, bool]:
    """Point gpuctl at this controller with the admin token file; returns the path and whether it was written.

    ``project`` becomes the default project of submits, unless the file
    gpud up wrote before names one (a user's choice stays). A client
    config that gpud up did not write (one naming another cluster, say)
    is left alone.
    """
    path = client_config_path(env)
    try:
        with open(path, encoding="utf-8") as f:
            if not f.readline().startswith(CLIENT_MARK):
                return path, False
            project = _project_in(f.read()) or project
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    text = (f"{CLIENT_MARK}; gpuctl reads it when GPUD_URL and GPUD_TOKEN are not set\n"
            f"url = {json.dumps(url)}\ntoken_file = {json.dumps(token_file)}\n")
    if project:
        text += f"# the project of submits that name none (-p, #GPUD --project and GPUD_PROJECT win)\n" \
                f"project = {json.dumps(project)}\n"
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path, True


def _project_in(text: str) -> str | None:
    import tomllib
    try:
        project = tomllib.loads(text).get("project")
    except tomllib.TOMLDecodeError:
        return None
    return project if isinstance(project, str) and project.strip() else None


def open_gpus(options: UpOptions) -> GpuBackend:
    """The node's GPUs: ``fake_gpus`` fakes, or NVML; UpError saying what to do when there is no GPU."""
    if options.fake_gpus is not None:
        if options.fake_gpus < 1:
            raise UpError(f"--fake-gpus must be at least 1 (got {options.fake_gpus})")
        return make_backend("fake", node_name=options.node_name, state_dir=options.node_dir,
                            fake_gpus=options.fake_gpus)
    try:
        return make_backend("nvml", node_name=options.node_name, state_dir=options.node_dir)
    except NoGpuError as exc:
        raise UpError(f"found no GPU on this machine ({exc}).\n"
                      f"To try gpud without GPUs, fake some:  gpud up --fake-gpus 8") from None


def lock_state_dir(state_dir: str) -> int:
    """Hold ``up.lock`` in the state directory so two ``gpud up`` cannot share it; returns the lock's fd."""
    fd = os.open(os.path.join(state_dir, "up.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UpError(f"another gpud up is using {state_dir}; stop it first, or give another --state-dir") from None
    return fd


def prepare(options: UpOptions) -> GpuBackend:
    """Make the state directories, lock them, open the GPUs and write the default policy if none exists."""
    for path in (options.state_dir, options.controller_dir, options.node_dir, options.run_dir):
        if path is None:
            continue
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise UpError(f"cannot use {path}: {exc.strerror or exc}") from None
    lock_state_dir(options.state_dir)
    backend = open_gpus(options)
    if options.policy is None and write_default_policy(options.policy_path, len(backend.gpus())):
        log.info("wrote the default policy to %s", options.policy_path)
    return backend


def controller_config(options: UpOptions) -> ControllerConfig:
    """The embedded controller's settings: loopback only, state and policy from the options."""
    from gpud.controller.state_dir import CLUSTER_ID_FILE
    from gpud.store.sqlite import FILE_NAME

    root = os.geteuid() == 0
    # A state directory gpud up has never used becomes a new cluster; a store that went missing or empty
    # in one it has used is refused, as by gpud controller.
    fresh = not any(os.path.exists(os.path.join(options.controller_dir, name))
                    for name in (CLUSTER_ID_FILE, FILE_NAME)) or options.store is not None  # --init: idempotent there
    # gpud up's token runs jobs as the user who started it: when that is root, as root. Its jobs run on this
    # host alone, so a user with no account here is refused at submit (as non-root, jobs run as the starter).
    return ControllerConfig(host="127.0.0.1", port=options.port, state_dir=options.controller_dir,
                            policy=options.policy_path, interval_s=2.0, synchronous=options.store_sync,
                            init=fresh, admin_allow_root=root, local_node=root, store=options.store)


def node_config(options: UpOptions, cluster_key: str, backend_kind: str) -> NodeConfig:
    """The embedded node's settings: it reaches the controller over loopback with the cluster key."""
    cpus, memory_gib = options.host_resources()
    return NodeConfig(controller_url=options.url, cluster_key=cluster_key, state_dir=options.node_dir,
                      run_dir=options.run_dir, name=options.node_name, gpu_backend=backend_kind,
                      fake_gpus=options.fake_gpus or 0, cpus=cpus, memory_gib=memory_gib)


async def serve(options: UpOptions, backend: GpuBackend, out: TextIO = sys.stdout) -> int:
    """Run the controller and the node until SIGINT/SIGTERM (or, with ``exit_when_idle``, until no job is left).

    Returns the exit status: 0, or 1 when ``exit_when_idle`` saw a job end
    in a state other than COMPLETED. Running tasks are left running on a
    signal; the next ``gpud up`` adopts them.
    """
    from aiohttp import web

    from gpud import demo
    from gpud.controller.app import make_app
    from gpud.controller.http_server import start_runner
    from gpud.controller.keys import CONTROLLER
    from gpud.controller.node_link import connect_in_process
    from gpud.errors import ConfigError
    from gpud.node.agent import NodeAgent
    from gpud.controller.state_dir import StateError
    from gpud.node.config import read_cluster_key
    from gpud.ui.server import UI_SERVER

    config = controller_config(options)
    try:
        app = make_app(config)
    except ConfigError as exc:
        raise UpError(str(exc)) from None
    except StateError as exc:
        raise UpError(f"{exc}\n(gpud up starts a new cluster only in a state directory it never used: for one, "
                      f"move {options.controller_dir} aside and run gpud up again)") from None
    runner = await start_runner(app, config.idle_timeout_s, handle_signals=False)
    agent = None
    try:
        try:
            await web.TCPSite(runner, "127.0.0.1", options.port).start()
        except OSError as exc:
            raise UpError(f"cannot listen on 127.0.0.1:{options.port} ({exc.strerror or exc}); "
                          f"is another gpud running? pick another port with --port") from None
        if options.store is not None:
            await _wait_leading(app[CONTROLLER], options)
        key = read_cluster_key(config.key_path)
        kind = "fake" if options.fake_gpus is not None else "nvml"
        # The node reaches the controller in this process through memory, not a loopback WebSocket.
        agent = NodeAgent(node_config(options, key, kind), backend, connect=connect_in_process(app[CONTROLLER]))
        await agent.start()
        async with demo.Api(options.url, options.admin_token_path) as api:
            await api.wait_node_up(options.node_name, NODE_UP_TIMEOUT_S)
            projects = app[CONTROLLER].policy.projects
            _announce(options, backend, kind, out, DEFAULT_PROJECT if DEFAULT_PROJECT in projects else None,
                      app[UI_SERVER].url)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, stop.set)
            try:
                return await demo.run(api, options, stop, out)
            finally:
                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(signum)
    finally:
        if agent is not None:
            await agent.stop()
        await runner.cleanup()


async def _wait_leading(ctrl, options: UpOptions) -> None:
    """With a PostgreSQL store, wait until this controller holds the lease and its admin token is written."""
    from gpud.store.postgres import shown
    deadline = time.monotonic() + LEAD_TIMEOUT_S
    while ctrl.role != "leader":  # set once the state is read back and the admin token written
        if time.monotonic() > deadline:
            raise UpError(f"another controller leads the cluster in {shown(options.store or '')}; gpud up needs "
                          f"a database of its own")
        await asyncio.sleep(0.05)
    if not os.path.exists(options.admin_token_path):
        raise UpError(f"the database {shown(options.store or '')} holds a cluster made elsewhere: its admin token "
                      f"is not in {options.admin_token_path}; give gpud up an empty database")


def _announce(options: UpOptions, backend: GpuBackend, kind: str, out: TextIO, project: str | None,
              ui_url: str = "") -> None:
    gpus = backend.gpus()
    what = f"{len(gpus)} fake GPU(s)" if kind == "fake" else \
        f"{len(gpus)} GPU(s) ({', '.join(sorted({g.model for g in gpus}))})"
    cpus, memory_gib = options.host_resources()
    if cpus is not None or memory_gib is not None:
        from gpud.cli.units import format_number, format_size_gib
        what += "".join([f", {format_number(cpus)} CPUs" if cpus is not None else "",
                         f", {format_size_gib(memory_gib)} memory" if memory_gib is not None else ""])
    path, written = write_client_config(options.url, options.admin_token_path, project=project)
    lines = [f"gpud up: controller on {options.url}, node {options.node_name} with {what}",
             f"  state in {options.state_dir}, policy {options.policy_path}"]
    if ui_url:
        lines.append(f"  dashboard on {ui_url} (sign in with the token in {options.admin_token_path})")
    if written:
        lines.append(f"  gpuctl is set up for you in {path}")
    else:
        lines += [f"  {path} was not written by gpud up and is left as it is; to use this cluster:",
                  f"    export GPUD_URL={options.url} GPUD_TOKEN=$(cat {options.admin_token_path})"]
    if not options.exit_when_idle:
        lines += ["", "Next, in another terminal:",
                  f"  gpuctl submit {'' if written and project else '-p default '}--gpus 1 -- python3 -c 'import os; "
                  "print(os.environ[\"CUDA_VISIBLE_DEVICES\"])'",
                  f"  gpuctl run {'' if written and project else '-p default '}--gpus 1"
                  "     # a shell on one GPU (Ctrl-D ends it)",
                  "  gpuctl queue            # pending and running jobs",
                  "  gpuctl history          # finished jobs; output is in gpud-<id>.out in the workdir",
                  "  gpuctl projects         # quotas and fair shares",
                  "Ctrl-C stops gpud; running jobs keep running and the next gpud up picks them up."]
    print("\n".join(lines), file=out, flush=True)


def run(options: UpOptions, out: TextIO = sys.stdout) -> int:
    """Prepare the state directory and serve; UpError when gpud up cannot start."""
    backend = prepare(options)
    try:
        return asyncio.run(serve(options, backend, out))
    finally:
        backend.close()
