"""``gpud controller``: run the controller daemon."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from dataclasses import replace

from gpud import sdnotify
from gpud.logfmt import FORMATS, setup_logging

EPILOG = """examples:
  gpud controller --config /etc/gpud/controller.toml
  gpud controller --listen 127.0.0.1:6830 --state-dir ./state --policy etc/gpud/policy.toml

The first start needs --init: it makes a new cluster (an empty store with a
new cluster id) and writes an admin token to admin.token and a cluster key to
cluster.key in the state directory (mode 0600), and says where. Without
--init a missing, empty or foreign store is refused, so a lost or damaged
store never silently becomes a new, empty cluster.

The admin token's jobs run as the user who ran --init, but never as root
unless --allow-root is given too.

With --store postgresql://USER@HOST:PORT/DB (or store = "postgresql://..."
in controller.toml) the cluster lives in PostgreSQL: --init is given once
per cluster, and any number of controllers may point at the database. One
leads (a lease renewed every second, taken over after [leader]
lease_timeout_s, 6 s by default); the others are standbys that answer API
calls with 503 and the leader's URL, and take over when it stops.

With [tls] cert and key in controller.toml (or --tls-cert and --tls-key)
the API, the nodes' WebSocket and the dashboard are served over TLS only
(https://, wss://); `gpud cert` makes a CA and certificates. Listening on
an address other than loopback without TLS is allowed, with a warning.

The controller runs on uvloop's event loop; GPUD_EVENT_LOOP=asyncio in its
environment runs Python's own asyncio loop instead, as it does, with a
warning, where uvloop cannot be imported (/metrics says which:
gpud_event_loop_info).
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``gpud controller``."""
    parser = subparsers.add_parser(
        "controller", help="run the controller daemon", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the controller: the API for gpuctl and node daemons, the durable job store, "
                    "and the scheduling loop.")
    parser.add_argument("--config", metavar="FILE", help="controller.toml (default: built-in defaults)")
    parser.add_argument("--listen", metavar="HOST:PORT", help="address to serve on (overrides the file)")
    parser.add_argument("--state-dir", metavar="DIR", help="where the SQLite store and keys live")
    parser.add_argument("--policy", metavar="FILE", help="the policy file (overrides the file)")
    parser.add_argument("--store", metavar="URL",
                        help="postgresql://USER@HOST:PORT/DB: keep the cluster in PostgreSQL, shared by several "
                             "controllers of which one leads (default: the SQLite file in the state directory)")
    parser.add_argument("--tls-cert", metavar="FILE",
                        help="serve TLS with this certificate (PEM, then its chain; overrides [tls] cert)")
    parser.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (overrides [tls] key)")
    parser.add_argument("--init", action="store_true",
                        help="start a new cluster when the state directory holds no store (the first start)")
    parser.add_argument("--allow-root", action="store_true",
                        help="with --init: the first admin token may run jobs as root (uid 0)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.add_argument("--log-format", default="text", choices=FORMATS,
                        help="text, or json: one JSON object per line (default: text)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the configuration and serve until SIGINT or SIGTERM; exit 2 on a bad configuration."""
    from gpud.controller.app import make_app
    from gpud.controller import event_loop
    from gpud.controller.config import load_config
    from gpud.controller.state_dir import StateError
    from gpud.errors import ConfigError
    from gpud.tls import TlsFileError, server_context

    setup_logging(args.log_level, args.log_format)
    try:
        loop_factory = event_loop.loop_factory()
    except event_loop.EventLoopError as exc:
        print(f"gpud controller: {exc}", file=sys.stderr)
        return 2
    try:
        config = replace(load_config(args.config, listen=args.listen, state_dir=args.state_dir, policy=args.policy,
                                     tls_cert=args.tls_cert, tls_key=args.tls_key, store=args.store),
                         init=args.init, admin_allow_root=args.allow_root)
        tls = server_context(config.tls_cert, config.tls_key) if config.tls_cert and config.tls_key else None
        app = make_app(config)
    except ConfigError as exc:
        print(f"gpud controller: {exc}", file=sys.stderr)
        return 2
    except TlsFileError as exc:
        print(f"gpud controller: TLS: {exc}", file=sys.stderr)
        return 2
    except StateError as exc:
        print(f"gpud controller: {exc}", file=sys.stderr)
        return 1
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve(app, config, tls))
    except StateError as exc:
        print(f"gpud controller: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"gpud controller: cannot serve on {config.host}:{config.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return 0


async def serve(app, config, tls=None) -> None:
    """Serve ``app`` (over TLS with the ssl context ``tls``) until SIGINT or SIGTERM; tell systemd READY=1 once
    listening and STOPPING=1 on the way out. A server listening beyond loopback without TLS is warned about."""
    import logging
    from aiohttp import web

    from gpud.controller.http_server import start_runner
    from gpud.ui.server import UI_SERVER

    runner = await start_runner(app, config.idle_timeout_s)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    try:
        await web.TCPSite(runner, config.host, config.port, ssl_context=tls).start()
        for warning in config.plain_http_warnings():
            logging.getLogger("gpud.controller").warning("%s", warning)
        where = config.state_dir if config.store is None else _shown(config.store)
        print(f"gpud controller: serving on {config.url}, state in {where}", file=sys.stderr, flush=True)
        if app[UI_SERVER].url:
            print(f"gpud controller: dashboard on {app[UI_SERVER].url}", file=sys.stderr, flush=True)
        sdnotify.ready(f"serving on {config.url}")
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        sdnotify.stopping()
    finally:
        await runner.cleanup()


def _shown(url: str) -> str:
    from gpud.store.postgres import shown
    return shown(url)
