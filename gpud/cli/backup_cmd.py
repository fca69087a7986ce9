"""``gpud backup DEST``: a consistent copy of the controller's store, taken while it runs."""

from __future__ import annotations

import argparse
import sys

EPILOG = """examples:
  gpud backup --config /etc/gpud/controller.toml /srv/backup/gpud-$(date +%F).sqlite
  gpud backup --state-dir ./state/controller gpud.sqlite.bak

The copy is made with SQLite's online backup, so the controller keeps
serving. To restore it: stop the controller, copy the backup over
gpud.sqlite in the state directory (removing gpud.sqlite-wal and
gpud.sqlite-shm), and start the controller again. The copy holds the
cluster id, so the controller takes it back as its own.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``gpud backup``."""
    parser = subparsers.add_parser(
        "backup", help="copy the controller's store, consistently, while it runs", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Copy the controller's SQLite store to DEST (mode 0600) with SQLite's online backup.")
    parser.add_argument("dest", metavar="DEST", help="the file to write (must not exist)")
    parser.add_argument("--config", metavar="FILE", help="controller.toml, for its state_dir")
    parser.add_argument("--state-dir", metavar="DIR", help="the controller's state directory (overrides the file)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the backup and say what it holds; exit 1 with the reason when it cannot be made."""
    from gpud.controller.config import load_config
    from gpud.controller.state_dir import StateError, backup
    from gpud.errors import ConfigError

    try:
        config = load_config(args.config, state_dir=args.state_dir)
        counts = backup(config.state_dir, args.dest)
    except ConfigError as exc:
        print(f"gpud backup: {exc}", file=sys.stderr)
        return 2
    except StateError as exc:
        print(f"gpud backup: {exc}", file=sys.stderr)
        return 1
    print(f"gpud backup: wrote {args.dest} ({counts['jobs']} jobs, {counts['tokens']} tokens) from "
          f"{config.state_dir}")
    return 0
