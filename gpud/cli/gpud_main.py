"""``gpud``: the daemon and admin command."""

from __future__ import annotations

import argparse
import os
import sys

from gpud import __version__
from gpud.cli import backup_cmd, cert_cmd, controller_cmd, dispatch, node_cmd, store_cmd, up_cmd
from gpud.cli.parsing import Parser
from gpud.errors import ConfigError
from gpud.plugins import make_plugin_manager, placement_strategies
from gpud.policy_file import ANY_PLACEMENT, check_placements, load_policy, parse_policy, require_projects


def check_config(args: argparse.Namespace) -> int:
    """Validate policy, controller and node files; print every mistake and where, exit 1 if any file is bad."""
    status = 0
    for path in args.files:
        warnings: list[str] = []
        try:
            print(f"{path}: ok ({_check_one(path, warnings)})")
            for warning in warnings:
                print(f"gpud check-config: warning: {warning}", file=sys.stderr)
        except ConfigError as exc:
            mistakes = _more_mistakes(path, exc)
            for mistake in mistakes:
                print(f"gpud check-config: {mistake}", file=sys.stderr)
            if len(mistakes) > 1:
                print(f"gpud check-config: {path}: {len(mistakes)} mistakes", file=sys.stderr)
            status = 1
    return status


def _more_mistakes(path: str, first: ConfigError) -> list[ConfigError]:
    """Every mistake of a policy file (the first one found, then the others); other files stop at the first."""
    from gpud.tomlcheck import every_mistake, read_toml

    try:
        data, source = read_toml(path)
    except ConfigError:
        return [first]   # a TOML syntax error: nothing after it can be read
    if _kind(path, data) != "policy":
        return [first]

    def check(data: dict) -> None:
        policy = require_projects(parse_policy(data, source, ANY_PLACEMENT), source)
        pm = make_plugin_manager(policy.plugins.disable, policy.plugins.directory)
        check_placements(policy, placement_strategies(pm), path)

    return every_mistake(check, data) or [first]


def _kind(path: str, data: dict) -> str:
    name = os.path.basename(path)
    if name.startswith("controller") or {"listen", "scheduler", "store", "auth"} & set(data):
        return "controller"
    if name.startswith("node") or {"controller_url", "gpu_backend", "fake_gpus"} & set(data):
        return "node"
    return "policy"


def _check_one(path: str, warnings: list[str]) -> str:
    from gpud.tomlcheck import read_toml

    data, _ = read_toml(path)
    kind = _kind(path, data)
    if kind == "controller":
        from gpud.controller.config import load_config

        config = load_config(path)
        warnings.extend(f"{path}: {warning}" for warning in config.plain_http_warnings())
        return f"controller config: listens on {config.url}, state in {config.state_dir}"
    if kind == "node":
        from gpud.node.config import load_node_config

        node = load_node_config(path, read_key=False)
        warnings.extend(_node_key_warnings(node, path))
        return f"node config: {node.name} in pool {node.pool}, controller {node.controller_url}"
    policy = load_policy(path, ANY_PLACEMENT)
    pm = make_plugin_manager(policy.plugins.disable, policy.plugins.directory)
    check_placements(policy, placement_strategies(pm), path)
    return (f"{len(policy.projects)} projects, {len(policy.departments)} departments, "
            f"{len(policy.pools) or 1} node pools")


def _node_key_warnings(node, path: str) -> list[str]:
    """A node file is valid without its key file (the key is copied in at install); say so, as a warning."""
    from gpud.node.config import read_cluster_key

    if not node.cluster_key_file:
        return [f"{path}: no cluster_key_file; the daemon then needs --cluster-key-file"]
    try:
        read_cluster_key(node.cluster_key_file, path)
    except ConfigError as exc:
        return [f"{exc} (copy the controller's cluster.key there before starting the node)"]
    return []


def build_parser() -> argparse.ArgumentParser:
    """The gpud argument parser with every sub-command."""
    parser = Parser(prog="gpud", description="gpud daemons and admin tools.")
    parser.add_argument("--version", action="version", version=f"gpud {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    check = subparsers.add_parser("check-config", help="validate policy, controller and node files",
                                  description="Check policy, controller and node files and say what is wrong and where "
                                              "(file, table, key, and line for syntax errors).")
    check.add_argument("files", nargs="+", metavar="FILE", help="policy.toml, controller.toml or node.toml")
    check.set_defaults(func=check_config)
    up_cmd.add_parser(subparsers)
    controller_cmd.add_parser(subparsers)
    node_cmd.add_parser(subparsers)
    backup_cmd.add_parser(subparsers)
    cert_cmd.add_parser(subparsers)
    store_cmd.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the sub-command; returns the exit status."""
    return dispatch(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
