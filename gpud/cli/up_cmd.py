"""``gpud up``: a controller and a node daemon in one process, the way to start on one machine."""

from __future__ import annotations

import argparse
import logging
import os
import sys

EPILOG = """examples:
  gpud up --fake-gpus 8 --demo --exit-when-idle   # try it: run the demo jobs, show the queue, exit
  gpud up --fake-gpus 8                           # serve until Ctrl-C, with 8 fake GPUs (64 CPUs, 512G)
  gpud up --fake-gpus 4 --fake-cpus 32 --fake-memory 256G
  gpud up                                         # serve this machine's NVIDIA GPUs
  gpud up --port 7000 --state-dir ./gpud-state --policy etc/gpud/policy.toml

gpud up writes the gpuctl settings (URL and admin token file, mode 0600) to
$XDG_CONFIG_HOME/gpud/client.toml (default ~/.config/gpud/client.toml), so
gpuctl run by the same user needs no flags. Without --policy it writes a
policy with the projects "default" (quota: every GPU of the machine, so
`gpuctl run` and `gpuctl notebook` start at once), "alice-lab" and "bob-lab"
into the state directory on its first start. Ctrl-C or SIGTERM stops gpud; running jobs keep
running and the next gpud up with the same state directory picks them up.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``gpud up``."""
    from gpud.controller.config import DEFAULT_PORT

    parser = subparsers.add_parser(
        "up", help="run a controller and a node in one process (start here)", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the controller and a node daemon for this machine's GPUs in one process, "
                    "with SQLite state, serving on 127.0.0.1 only.")
    parser.add_argument("--fake-gpus", type=int, metavar="N", help="use N fake GPUs instead of NVML")
    from gpud.cli.node_cmd import add_fake_host_flags
    add_fake_host_flags(parser)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port on 127.0.0.1 (default {DEFAULT_PORT})")
    parser.add_argument("--state-dir", metavar="DIR",
                        help="jobs, keys, tasks and the default policy (default $XDG_DATA_HOME/gpud, "
                             "i.e. ~/.local/share/gpud)")
    parser.add_argument("--run-dir", metavar="DIR",
                        help="keep the running tasks' state here instead of the state dir, e.g. on a tmpfs")
    parser.add_argument("--policy", metavar="FILE", help="the policy file (default: policy.toml in the state dir, "
                                                         "written on the first start)")
    parser.add_argument("--demo", action="store_true",
                        help="submit example jobs from two projects so gpuctl queue shows fair sharing")
    parser.add_argument("--exit-when-idle", action="store_true",
                        help="print each job's progress and exit once no job is pending or running "
                             "(status 1 if any job did not complete)")
    parser.add_argument("--store-sync", choices=("full", "normal"), default="full",
                        help="full: every accepted change is fsync'd (survives a power cut; the default); "
                             "normal: survives a crash of gpud, not a power cut, and is faster on slow disks")
    parser.add_argument("--store", metavar="URL",
                        help="keep the controller's state in this PostgreSQL database (postgresql://USER@HOST:PORT/DB, "
                             "sslmode and other libpq parameters as in gpud controller --store) instead of the SQLite "
                             "file in the state directory; the database's cluster is made on first use")
    parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Start the all-in-one gpud; exit 0 when stopped, 1 when it cannot start or a job failed with --exit-when-idle."""
    from gpud.allinone import UpError, UpOptions, default_state_dir
    from gpud.allinone import run as run_up
    from gpud.controller.config import check_store
    from gpud.errors import ConfigError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not 0 < args.port < 65536:
        print(f"gpud up: --port must be between 1 and 65535 (got {args.port})", file=sys.stderr)
        return 2
    try:
        store = check_store(args.store) if args.store else None
    except ConfigError as exc:
        print(f"gpud up: {exc}", file=sys.stderr)
        return 2
    options = UpOptions(state_dir=os.path.abspath(args.state_dir or default_state_dir()), port=args.port,
                        fake_gpus=args.fake_gpus, policy=os.path.abspath(args.policy) if args.policy else None,
                        demo=args.demo, exit_when_idle=args.exit_when_idle, store_sync=args.store_sync,
                        store=store, run_dir=os.path.abspath(args.run_dir) if args.run_dir else None,
                        fake_cpus=args.fake_cpus, fake_memory_gib=args.fake_memory)
    try:
        return run_up(options)
    except (UpError, RuntimeError) as exc:
        print(f"gpud up: {exc}", file=sys.stderr)
        return 1
