"""The node daemon's configuration file (etc/gpud/node.toml), with command-line overrides."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, replace
from typing import Mapping
from urllib.parse import urlsplit

from gpud.errors import ConfigError
from gpud.gpu import BACKENDS
from gpud.tomlcheck import Table, choices, quote, read_toml

DEFAULT_URL = "http://127.0.0.1:6830"
DEFAULT_STATE_DIR = "/var/lib/gpud/node"
TOP_KEYS = ("controller_url", "ca_file", "cluster_key_file", "state_dir", "run_dir", "name", "pool", "labels", "gpu_backend",
            "fake_gpus", "poll_s", "reconnect_max_s", "cpus", "memory_gib", "metrics_listen")
DEFAULT_METRICS_LISTEN = "127.0.0.1:6831"
# A fake node looks like a real GPU server (a DGX H100 has 8 GPUs, 112 cores, 2 TiB), not like the
# laptop it runs on: otherwise jobs asking for the default 1 CPU each leave fake GPUs idle on a 2-core host.
FAKE_CPUS_PER_GPU = 8
FAKE_MEMORY_GIB_PER_GPU = 64


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Who the node is, where its controller and state are, and which GPU backend it uses.

    ``cluster_key`` is the key itself; a daemon reads it from
    ``cluster_key_file``, an in-process node is handed it directly.
    """

    controller_url: str = DEFAULT_URL
    ca_file: str | None = None  # the CA certificates an https controller's certificate is checked against
    cluster_key: str = ""
    cluster_key_file: str | None = None
    state_dir: str = DEFAULT_STATE_DIR
    run_dir: str | None = None
    name: str = field(default_factory=socket.gethostname)
    pool: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    gpu_backend: str = "nvml"
    fake_gpus: int = 0
    poll_s: float = 1.0
    reconnect_max_s: float = 10.0
    cpus: float | None = None
    memory_gib: float | None = None
    metrics_listen: str = DEFAULT_METRICS_LISTEN

    @property
    def connect_url(self) -> str:
        """The WebSocket URL of the (first) controller's node endpoint."""
        return self.connect_urls[0]

    @property
    def connect_urls(self) -> list[str]:
        """The WebSocket URLs of the node endpoints of every controller named (comma-separated URLs)."""
        urls = []
        for url in self.controller_url.split(","):
            parts = urlsplit(url.strip())
            scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
            urls.append(f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}/api/v1/node/connect")
        return urls


def _check_url(url: str, source: str, where: str) -> str:
    """One controller URL, or several separated by commas (the controllers of one cluster)."""
    for one in url.split(","):
        parts = urlsplit(one.strip())
        if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
            raise ConfigError(source, where, f"expected a URL such as {DEFAULT_URL} (or several, separated by "
                                             f"commas), got {quote(one.strip() or url)}")
    return ",".join(one.strip() for one in url.split(","))


def _check_listen(value: str, source: str) -> str:
    if value in ("", "off"):
        return ""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(source, "metrics_listen",
                          f'expected HOST:PORT such as {DEFAULT_METRICS_LISTEN}, or "off", got {quote(value)}')
    return value


def read_cluster_key(path: str, source: str = "", where: str = "cluster_key_file") -> str:
    """The cluster key in ``path`` (one line, surrounding whitespace ignored); a ConfigError if unusable."""
    try:
        with open(path, encoding="utf-8") as f:
            key = f.read().strip()
    except OSError as exc:
        raise ConfigError(source or path, where if source else "",
                          f"cannot read the cluster key file {path}: {exc.strerror or exc}") from None
    if not key:
        raise ConfigError(source or path, where if source else "", f"the cluster key file {path} is empty")
    return key


def load_node_config(path: str | None, *, controller: str | None = None, state_dir: str | None = None,
                     run_dir: str | None = None, fake_gpus: int | None = None, name: str | None = None,
                     cluster_key_file: str | None = None, read_key: bool = True, cpus: float | None = None,
                     memory_gib: float | None = None, ca_file: str | None = None) -> NodeConfig:
    """The configuration from ``path`` (or the defaults when None), then the flags that override it.

    Relative paths in the file are relative to the file's directory.
    ``fake_gpus`` from a flag selects the fake backend. A fake node that
    declares no ``cpus`` or ``memory_gib`` reports a realistic host
    (fake_host_resources), not this machine's. The cluster key
    file, when one is named, is read here (unless ``read_key`` is False).
    """
    config = NodeConfig()
    source = path or "command line"
    changes: dict = {}
    if path is not None:
        data, source = read_toml(path)
        top = Table(data, source, "", TOP_KEYS)
        base = os.path.dirname(os.path.abspath(path))
        if "controller_url" in top:
            changes["controller_url"] = _check_url(top.string("controller_url"), source, "controller_url")
        for key in ("state_dir", "run_dir", "cluster_key_file", "ca_file"):
            if key in top:
                changes[key] = os.path.join(base, top.string(key))
        for key in ("name", "pool"):
            if key in top:
                changes[key] = top.string(key)
        changes["labels"] = top.labels("labels")
        backend = top.string("gpu_backend", config.gpu_backend)
        if backend not in BACKENDS:
            raise top.error("gpu_backend", f"unknown GPU backend {quote(backend)} (known: {choices(BACKENDS)})")
        changes["gpu_backend"] = backend
        changes["fake_gpus"] = top.integer("fake_gpus", 0, lo=0, hi=4096)
        if backend == "fake" and "fake_gpus" not in top:
            raise top.error("fake_gpus", 'is required when gpu_backend = "fake"')
        changes["poll_s"] = top.number("poll_s", config.poll_s, above=0)
        changes["reconnect_max_s"] = top.number("reconnect_max_s", config.reconnect_max_s, above=0)
        changes["cpus"] = top.number("cpus", None, above=0)
        changes["memory_gib"] = top.number("memory_gib", None, above=0)
        if "metrics_listen" in top:
            changes["metrics_listen"] = _check_listen(top.string("metrics_listen"), source)
    if controller is not None:
        changes["controller_url"] = _check_url(controller, "--controller", "")
    if state_dir is not None:
        changes["state_dir"] = os.path.abspath(state_dir)
    if run_dir is not None:
        changes["run_dir"] = os.path.abspath(run_dir)
    if name is not None:
        changes["name"] = name
    if cluster_key_file is not None:
        changes["cluster_key_file"] = os.path.abspath(cluster_key_file)
    if ca_file is not None:
        changes["ca_file"] = os.path.abspath(ca_file)
    if fake_gpus is not None:
        if fake_gpus < 0:
            raise ConfigError("--fake-gpus", "", f"must not be negative (got {fake_gpus})")
        changes["gpu_backend"], changes["fake_gpus"] = "fake", fake_gpus
    for flag, key, value in (("--fake-cpus", "cpus", cpus), ("--fake-memory", "memory_gib", memory_gib)):
        if value is not None:
            if not value > 0:
                raise ConfigError(flag, "", f"must be more than 0 (got {value:g})")
            changes[key] = value
    config = replace(config, **changes)
    if config.gpu_backend == "fake":
        host_cpus, host_memory = fake_host_resources(config.fake_gpus)
        config = replace(config, cpus=host_cpus if config.cpus is None else config.cpus,
                         memory_gib=host_memory if config.memory_gib is None else config.memory_gib)
    if config.cluster_key_file and read_key:
        where_source = source if path is not None and cluster_key_file is None else ""
        config = replace(config, cluster_key=read_cluster_key(config.cluster_key_file, where_source))
    return config


def fake_host_resources(gpus: int) -> tuple[float, float]:
    """The CPUs and GiB of memory a fake node with ``gpus`` GPUs reports unless told otherwise."""
    count = max(1, gpus)
    return float(FAKE_CPUS_PER_GPU * count), float(FAKE_MEMORY_GIB_PER_GPU * count)
