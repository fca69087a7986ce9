"""What every gpuctl verb that talks to the controller shares: the client, errors as exit codes, --json.

Nothing here imports argparse (gpud.cli.parsing is its side): a plain submit or queue never needs it.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing is not imported at run time: gpuctl starts faster
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

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


def guarded(verb: str, func: Callable[[Any], int]) -> Callable[[Any], int]:
    """``func`` run for gpuctl ``verb``: a UsageError or a ClientError is said in one line on stderr and becomes the
    exit status; a pipe closed early (``gpuctl queue | head``) is not an error."""
    def run(args: Any) -> int:
        from gpud.client import ClientError
        try:
            return func(args)
        except UsageError as exc:
            print(f"gpuctl {verb}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except ClientError as exc:
            print(f"gpuctl {verb}: {exc}", file=sys.stderr)
            return exc.exit_code
        except BrokenPipeError:
            sys.stderr.close()
            return EXIT_OK
    run.__name__ = run.__qualname__ = getattr(func, "__name__", "run")
    run.__doc__ = func.__doc__
    return run


def client():
    """A client for the controller named by GPUD_URL/GPUD_TOKEN or the client config file."""
    from gpud.client import Client
    return Client.from_environment()


def print_json(doc: object) -> None:
    """Print a JSON document, indented, as the API sent it."""
    import json
    print(json.dumps(doc, indent=2, sort_keys=False))


def _naming(job_id: str, error: Exception) -> str:
    """The error's message with the job it is about named once: prefixed with "job ID: " unless the
    controller says its message names a job."""
    return str(error) if getattr(error, "job", None) is not None else f"job {job_id}: {error}"


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
            print(f"gpuctl {verb}: {_naming(job_id, exc)}", file=sys.stderr)
            status = max(status, exc.exit_code)
    return status
