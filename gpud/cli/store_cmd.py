"""``gpud store copy --from sqlite:PATH --to postgresql://...``: move a cluster's store into PostgreSQL."""

from __future__ import annotations

import argparse
import sys

EPILOG = """examples:
  gpud store copy --from sqlite:/var/lib/gpud/controller --to postgresql://gpud@db-host:5432/gpud

Stop the controller first (the copy refuses a store in use). Every job,
event, node, token, idempotency answer, the usage history, the cluster id
and the cluster key (cluster.key beside the store, or --key FILE) are
copied in one transaction into a database that holds no cluster yet; then
start the controllers with store = "postgresql://..." and no --init.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``gpud store``."""
    parser = subparsers.add_parser("store", help="move the controller's store (gpud store copy)",
                                   description="Work on the controller's store.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    copy = verbs.add_parser("copy", help="copy a SQLite store into an empty PostgreSQL database", epilog=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            description="Copy a cluster from its SQLite store into an empty PostgreSQL database.")
    copy.add_argument("--from", dest="source", metavar="sqlite:PATH", required=True,
                      help="the SQLite store: its gpud.sqlite, or the controller's state directory")
    copy.add_argument("--to", dest="dest", metavar="URL", required=True,
                      help="postgresql://USER@HOST:PORT/DB, an empty database (or one without a cluster)")
    copy.add_argument("--key", metavar="FILE", help="the cluster key file (default: cluster.key beside the store)")
    copy.set_defaults(func=run_copy)


def run_copy(args: argparse.Namespace) -> int:
    """Copy and say how much; exit 1 with the reason, having written nothing, when it cannot."""
    from gpud.store.copy import CopyError, copy_to_postgres
    from gpud.store.postgres import shown

    try:
        counts = copy_to_postgres(args.source, args.dest, args.key)
    except (CopyError, RuntimeError) as exc:
        print(f"gpud store copy: {exc}", file=sys.stderr)
        return 1
    print(f"gpud store copy: copied {counts['jobs']} jobs, {counts['events']} events, {counts['nodes']} nodes, "
          f"{counts['tokens']} tokens and the cluster key into {shown(args.dest)}")
    return 0
