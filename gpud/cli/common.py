"""What every gpuctl verb that talks to the controller shares: the client, errors as exit codes, --json.

argparse is not imported here: a plain submit or queue is parsed without it
(gpud.cli.quickparse); the parser classes are in gpud.cli.parsers.
"""

from __future__ import annotations

import sys

# typing, and functools and collections.abc (which import collections), cost every gpuctl call ~4 ms;
# their names are needed only by type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3

EXIT_STATUS_HELP = """\
exit status: 0 ok, 1 the controller refused the request (4xx), 2 usage error,
3 cannot reach the controller or it failed (5xx)."""

ENVIRONMENT_HELP = """\
environment: GPUD_URL (default http://127.0.0.1:6830), GPUD_TOKEN, GPUD_TIMEOUT
(seconds, default 30), GPUD_RETRY (seconds reads and submits wait for a
controller that refuses connections, default 10, 0: none); otherwise url and
token or token_file in $XDG_CONFIG_HOME/gpud/client.toml."""


class UsageError(Exception):
    """A command line or input file gpuctl refuses before asking the controller (exit 2)."""


def add_verb(subparsers, name: str, *, help: str, description: str, examples: str,
             func: Callable[[argparse.Namespace], int], json_flag: bool = False) -> argparse.ArgumentParser:
    """Register one verb with a description, an epilog of examples, and optionally ``--json``."""
    from gpud.cli.parsers import Formatter
    parser = subparsers.add_parser(
        name, help=help, description=description,
        epilog=f"examples:\n{examples.rstrip()}\n\n{EXIT_STATUS_HELP}\n{ENVIRONMENT_HELP}",
        formatter_class=Formatter)
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print the controller's JSON answer")
    parser.set_defaults(func=guarded(parser.prog.removeprefix("gpuctl "), func))  # "policy reload", as typed
    return parser


def guarded(verb: str, func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``func`` run as gpuctl ``verb``: a refusal, an unreachable controller or a usage error printed on
    stderr in one line ("gpuctl VERB: ..."), the exit status for it returned."""
    def run(args: argparse.Namespace) -> int:
        from gpud.client import ClientError
        try:
            return func(args)
        except UsageError as exc:
            print(f"gpuctl {verb}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except ClientError as exc:
            print(f"gpuctl {verb}: {exc}", file=sys.stderr)
            return exc.exit_code
        except BrokenPipeError:  # `gpuctl queue | head` closes the pipe early; that is not an error
            sys.stderr.close()
            return EXIT_OK
    # What functools.wraps would set (functools is not imported, see above).
    run.__name__, run.__doc__ = func.__name__, func.__doc__
    run.__wrapped__ = func  # type: ignore[attr-defined]
    return run


def client():
    """A client for the controller named by GPUD_URL/GPUD_TOKEN or the client config file."""
    from gpud.client import Client
    return Client.from_environment()


def print_json(doc: object) -> None:
    """Print a JSON document, indented, as the API sent it."""
    import json
    print(json.dumps(doc, indent=2, sort_keys=False))


def _naming(job_id: str, message: str) -> str:
    """``message`` with the job it is about named once: prefixed with "job ID: " unless it names the job."""
    import re
    if re.search(rf"\b(job|array) {re.escape(job_id)}\b", message):
        return message
    return f"job {job_id}: {message}"


def for_each(verb: str, ids: list[str], action: Callable[[str], object]) -> int:
    """Run ``action`` on every id, go on past failures (each printed), return the worst exit status."""
    from gpud.client import ClientError
    status = EXIT_OK
    for job_id in ids:
        try:
            action(job_id)
        except ClientError as exc:
            if exc.exit_code == EXIT_UNREACHABLE:
                raise  # the next ids would fail the same way
            print(f"gpuctl {verb}: {_naming(job_id, str(exc))}", file=sys.stderr)
            status = max(status, exc.exit_code)
    return status
