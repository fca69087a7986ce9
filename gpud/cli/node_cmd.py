"""``gpud node``: the node daemon's command line."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from gpud.errors import ConfigError
from gpud.logfmt import FORMATS, setup_logging


def run_node(args: argparse.Namespace) -> int:
    """Load the node configuration with the flags' overrides and run the daemon; 1 when it cannot start."""
    from gpud.node.config import load_node_config
    from gpud.node.daemon import NodeStartError, run

    setup_logging(args.log_level, args.log_format)
    try:
        config = load_node_config(args.config, controller=args.controller, state_dir=args.state_dir,
                                  run_dir=args.run_dir, fake_gpus=args.fake_gpus, name=args.name,
                                  cluster_key_file=args.cluster_key_file, cpus=args.fake_cpus,
                                  memory_gib=args.fake_memory, ca_file=args.ca_file)
        if args.metrics_listen is not None:
            config = dataclasses.replace(config, metrics_listen="" if args.metrics_listen == "off"
                                         else args.metrics_listen)
        run(config)
    except (ConfigError, NodeStartError) as exc:
        print(f"gpud node: {exc}", file=sys.stderr)
        return 1
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``node`` sub-command on ``subparsers`` and return its parser."""
    node = subparsers.add_parser(
        "node", help="run the node daemon of a GPU host",
        description="Register this host's GPUs with the controller and run the tasks it orders. "
                    "Tasks keep running when the daemon restarts; it adopts them again.")
    node.add_argument("--config", metavar="FILE", help="node configuration (TOML), e.g. /etc/gpud/node.toml")
    node.add_argument("--controller", metavar="URL", help="the controller's URL (overrides controller_url)")
    node.add_argument("--state-dir", metavar="DIR",
                      help="where the jobs' checkpoint directories, and tasks' state, are kept (overrides state_dir)")
    node.add_argument("--run-dir", metavar="DIR",
                      help="where tasks' state is kept instead, e.g. /run/gpud/node on a tmpfs (overrides run_dir)")
    node.add_argument("--cluster-key-file", metavar="FILE", help="the cluster key (overrides cluster_key_file)")
    node.add_argument("--ca-file", metavar="FILE",
                      help="the CA certificate an https controller's certificate is checked against "
                           "(overrides ca_file; default: the system's CAs)")
    node.add_argument("--fake-gpus", type=int, metavar="N", help="use N fake GPUs instead of NVML")
    add_fake_host_flags(node)
    node.add_argument("--name", help="the node's name (default: the host name)")
    node.add_argument("--metrics-listen", metavar="HOST:PORT",
                      help='serve /metrics here (overrides metrics_listen; default 127.0.0.1:6831; "off": none)')
    node.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    node.add_argument("--log-format", default="text", choices=FORMATS,
                      help="text, or json: one JSON object per line (default: text)")
    node.set_defaults(func=run_node)
    return node


def add_fake_host_flags(parser: argparse.ArgumentParser) -> None:
    """``--fake-cpus`` and ``--fake-memory``: the CPUs and memory the node reports, whatever this host has."""
    from gpud.node.config import FAKE_CPUS_PER_GPU, FAKE_MEMORY_GIB_PER_GPU
    parser.add_argument("--fake-cpus", type=_positive(float, "a number of CPUs such as 64"), metavar="N",
                        help=f"report N CPUs (overrides cpus; with --fake-gpus the default is "
                             f"{FAKE_CPUS_PER_GPU} per GPU, not this host's)")
    parser.add_argument("--fake-memory", type=_positive(_size, "a size such as 512G"), metavar="SIZE",
                        help=f"report SIZE of memory, e.g. 512G (overrides memory_gib; with --fake-gpus "
                             f"the default is {FAKE_MEMORY_GIB_PER_GPU}G per GPU)")


def _size(text: str) -> float:
    from gpud.cli.units import parse_size_gib
    return parse_size_gib(text)


def _positive(convert, example: str):
    def check(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            value = 0.0
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"expected {example}, got {text!r}")
        return value
    check.__name__ = example
    return check
