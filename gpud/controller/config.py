"""The controller's configuration file (etc/gpud/controller.toml), with command-line overrides."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from gpud.errors import ConfigError
from gpud.tomlcheck import Table, read_toml

DEFAULT_PORT = 6830
UI_PORT_OFFSET = 2  # the dashboard's default port is the API's + 2: 6831 is a node daemon's metrics port
TOP_KEYS = ("listen", "state_dir", "policy", "cluster_key_file", "scheduler", "store", "auth", "api",
            "interactive", "ui", "tls", "leader")
SCHEDULER_KEYS = ("interval_s", "debounce_ms", "node_timeout_s", "heartbeat_s")
STORE_KEYS = ("synchronous", "url")
LEADER_KEYS = ("lease_timeout_s", "renew_s", "url")
DEFAULT_LEASE_TIMEOUT_S = 6.0  # a standby takes over this long after the leader's last renewal
DEFAULT_RENEW_S = 1.0
AUTH_KEYS = ("admin_token_file",)
INTERACTIVE_KEYS = ("detach_timeout_s",)
UI_KEYS = ("enabled", "listen", "secure_cookie")
TLS_KEYS = ("cert", "key")
API_KEYS = ("max_body_mib", "idle_timeout_s", "body_timeout_s", "submit_rate", "submit_burst")


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Where the controller listens and keeps its state, which policy it runs, and its timings."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    state_dir: str = "/var/lib/gpud"
    policy: str = "/etc/gpud/policy.toml"
    cluster_key_file: str | None = None
    admin_token_file: str | None = None
    interval_s: float = 10.0
    debounce_ms: float = 2.0
    node_timeout_s: float = 60.0
    heartbeat_s: float = 5.0
    synchronous: str = "full"
    init: bool = False              # --init: a missing or empty store starts a new cluster
    admin_allow_root: bool = False  # the first admin token may run jobs as uid 0 (--allow-root)
    local_node: bool = False        # jobs run on this host only (gpud up): users must have an account here
    detach_timeout_s: float = 600.0  # how long a terminal nobody is attached to is kept
    max_body_mib: float = 4.0       # a request body larger than this is refused (413) while it streams
    idle_timeout_s: float = 60.0    # a connection that sends no complete request for this long is closed
    body_timeout_s: float = 30.0    # a body that takes longer than this to arrive is refused (408)
    submit_rate: float = 0.0        # jobs per second each token may submit, on average; 0: no limit
    submit_burst: float = 0.0       # jobs a token may submit at once above the rate (0: a second's worth)
    ui: bool = True                 # serve the web dashboard (gpud/ui) on a port of its own
    ui_host: str | None = None      # where the dashboard listens: None, the API's host
    ui_port: int | None = None      # None: the API's + UI_PORT_OFFSET (0 when the API's is 0: any free port)
    ui_secure_cookie: bool = False  # mark the session cookie Secure even over plain HTTP (behind a TLS proxy)
    tls_cert: str | None = None     # the certificate (PEM, then its chain) the API and the dashboard serve TLS with
    tls_key: str | None = None      # its private key

    store: str | None = None        # postgresql://USER@HOST:PORT/DB; None: the SQLite file in state_dir
    lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S  # PostgreSQL only: a leader silent this long is replaced
    renew_s: float = DEFAULT_RENEW_S                  # how often the leader renews its lease
    advertise_url: str | None = None  # the URL other controllers send clients to when this one leads

    @property
    def tls(self) -> bool:
        """Whether the API, the node link and the dashboard are served over TLS (https, wss)."""
        return self.tls_cert is not None

    @property
    def postgres(self) -> bool:
        """True when the store is a PostgreSQL database (several controllers, one leader)."""
        return self.store is not None

    @property
    def leader_url(self) -> str:
        """The URL a standby names when this controller leads: ``[leader] url``, else the listen address."""
        if self.advertise_url:
            return self.advertise_url
        if self.host in ("0.0.0.0", "::", ""):
            import socket
            host = socket.getfqdn()
            return f"{'https' if self.tls else 'http'}://{host}:{self.port}"
        return self.url

    @property
    def key_path(self) -> str:
        """The cluster key file: the configured one, or ``cluster.key`` in the state directory."""
        return self.cluster_key_file or os.path.join(self.state_dir, "cluster.key")

    @property
    def admin_token_path(self) -> str:
        """Where the first admin token is written: ``admin.token`` in the state directory by default."""
        return self.admin_token_file or os.path.join(self.state_dir, "admin.token")

    @property
    def ui_address(self) -> tuple[str, int]:
        """Where the dashboard listens: ``[ui] listen``, else the API's host on the API's port + 2 (6832)."""
        port = self.ui_port if self.ui_port is not None else (self.port + UI_PORT_OFFSET if self.port else 0)
        return self.ui_host or self.host, port

    @property
    def url(self) -> str:
        """The URL clients use to reach the controller."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def plain_http_warnings(self) -> list[str]:
        """A warning for each server that listens beyond this host without TLS (the API, the dashboard)."""
        from gpud.tls import is_loopback
        if self.tls:
            return []
        why = ("tokens, the cluster key and jobs' environments cross the network in clear; set [tls] cert and "
               "key in controller.toml (docs/admin-guide.md, \"TLS\")")
        warnings = []
        if not is_loopback(self.host):
            warnings.append(f"the API listens on {self.host}:{self.port} without TLS: {why}")
        ui_host, ui_port = self.ui_address
        if self.ui and not is_loopback(ui_host):
            warnings.append(f"the dashboard listens on {ui_host}:{ui_port} without TLS: its sign-in tokens and "
                            f"session cookies cross the network in clear; set [tls] cert and key in controller.toml")
        return warnings


def parse_listen(text: str, source: str = "--listen", where: str = "") -> tuple[str, int]:
    """HOST:PORT (or [v6]:PORT) as a host and a port; a ConfigError saying what is wrong otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(source, where, f"expected HOST:PORT such as 127.0.0.1:{DEFAULT_PORT}, got {text!r}")
    return host, int(port)


def check_store(text: str, source: str = "--store", where: str = "") -> str:
    """A PostgreSQL URL as given; a ConfigError for anything else (SQLite is the default: no setting)."""
    from urllib.parse import urlsplit
    if not text.startswith(("postgresql://", "postgres://")) or not urlsplit(text).hostname and "host=" not in text:
        raise ConfigError(source, where, f"expected a PostgreSQL URL such as postgresql://gpud@db-host:5432/gpud, "
                                         f"got {text.split('@')[-1]!r} (leave it out for the SQLite file in the "
                                         f"state directory)")
    return text


def load_config(path: str | None, *, listen: str | None = None, state_dir: str | None = None,
                policy: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
                store: str | None = None) -> ControllerConfig:
    """The configuration from ``path`` (or the defaults when None), then the flags that override it.

    ``[tls]`` needs both ``cert`` and ``key`` (or neither), as do the flags;
    the files themselves are read when the controller starts.
    """
    config = ControllerConfig()
    if path is not None:
        data, source = read_toml(path)
        top = Table(data, source, "", TOP_KEYS)
        base = os.path.dirname(os.path.abspath(path))
        changes: dict = {}
        if "listen" in top:
            changes["host"], changes["port"] = parse_listen(top.string("listen"), source, "listen")
        for key in ("state_dir", "policy", "cluster_key_file"):
            if key in top:
                changes[key] = os.path.join(base, top.string(key))
        sched = top.table("scheduler", SCHEDULER_KEYS)
        changes["interval_s"] = sched.number("interval_s", config.interval_s, lo=0.01)
        changes["debounce_ms"] = sched.number("debounce_ms", config.debounce_ms, lo=0)
        changes["node_timeout_s"] = sched.number("node_timeout_s", config.node_timeout_s, lo=0.1)
        changes["heartbeat_s"] = sched.number("heartbeat_s", config.heartbeat_s, lo=0.05)
        if isinstance(top.data.get("store"), str):  # store = "postgresql://..."
            changes["store"] = check_store(top.string("store"), source, "store")
            stored = Table({}, source, "store", STORE_KEYS)
        else:
            stored = top.table("store", STORE_KEYS)
            if "url" in stored:
                changes["store"] = check_store(stored.string("url"), source, "store.url")
        changes["synchronous"] = stored.string("synchronous", config.synchronous)
        if changes["synchronous"] not in ("full", "normal"):
            raise stored.error("synchronous", 'expected "full" (survives power loss) or "normal" '
                                             '(survives a controller crash)')
        auth = top.table("auth", AUTH_KEYS)
        if "admin_token_file" in auth:
            changes["admin_token_file"] = os.path.join(base, auth.string("admin_token_file"))
        interactive = top.table("interactive", INTERACTIVE_KEYS)
        changes["detach_timeout_s"] = interactive.number("detach_timeout_s", config.detach_timeout_s, lo=0)
        api = top.table("api", API_KEYS)
        changes["max_body_mib"] = api.number("max_body_mib", config.max_body_mib, lo=0.001)
        changes["idle_timeout_s"] = api.number("idle_timeout_s", config.idle_timeout_s, lo=0.1)
        changes["body_timeout_s"] = api.number("body_timeout_s", config.body_timeout_s, lo=0.1)
        changes["submit_rate"] = api.number("submit_rate", config.submit_rate, lo=0)
        changes["submit_burst"] = api.number("submit_burst", config.submit_burst, lo=0)
        leader = top.table("leader", LEADER_KEYS)
        changes["lease_timeout_s"] = leader.number("lease_timeout_s", config.lease_timeout_s, lo=0.5)
        changes["renew_s"] = leader.number("renew_s", config.renew_s, lo=0.05)
        if changes["renew_s"] * 2 > changes["lease_timeout_s"]:
            raise ConfigError(source, "leader.renew_s", "must be at most half of lease_timeout_s, so that one "
                                                        "late renewal does not hand the lease over")
        if "url" in leader:
            changes["advertise_url"] = leader.string("url").rstrip("/")
        ui = top.table("ui", UI_KEYS)
        changes["ui"] = ui.boolean("enabled", True)
        changes["ui_secure_cookie"] = ui.boolean("secure_cookie", False)
        if "listen" in ui:
            changes["ui_host"], changes["ui_port"] = parse_listen(ui.string("listen"), source, "ui.listen")
        tls = top.table("tls", TLS_KEYS)
        for key in TLS_KEYS:
            if key in tls:
                changes[f"tls_{key}"] = os.path.join(base, tls.string(key))
        if ("cert" in tls) != ("key" in tls):
            raise tls.error("key" if "cert" in tls else "cert", "is needed too: [tls] takes a cert and its key")
        if changes["heartbeat_s"] >= changes["node_timeout_s"]:
            raise ConfigError(source, "scheduler.heartbeat_s", "must be shorter than node_timeout_s")
        config = replace(config, **changes)
    if listen is not None:
        host, port = parse_listen(listen)
        config = replace(config, host=host, port=port)
    if state_dir is not None:
        config = replace(config, state_dir=os.path.abspath(state_dir))
    if policy is not None:
        config = replace(config, policy=os.path.abspath(policy))
    if store is not None:
        config = replace(config, store=check_store(store))
    if (tls_cert is None) != (tls_key is None):
        raise ConfigError("--tls-key" if tls_cert else "--tls-cert", "",
                          "is needed too: --tls-cert and --tls-key go together")
    if tls_cert is not None and tls_key is not None:
        config = replace(config, tls_cert=os.path.abspath(tls_cert), tls_key=os.path.abspath(tls_key))
    return config
